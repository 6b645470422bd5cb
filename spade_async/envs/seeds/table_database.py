"""Multi-turn tool use on a tiny table database: look up a department, update salaries, report."""

import json
import random

FIRST = "Ada Bo Cy Dee Eli Fay Gus Hal Ivy Jo Kim Lu Max Ned Oz Pam Rae Sol Tess Uma Vic Yan".split()
LAST = "Park Stone Reyes Okafor Novak Lind Mori Haas Diaz Berg".split()
DEPTS = "Sales Research Support Finance Legal Design Ops".split()
OPS = ["=", "!=", "<", "<=", ">", ">="]
WHERE = {"type": "array", "description": "conditions that must all hold",
         "items": {"type": "object", "properties": {
             "column": {"type": "string"}, "op": {"type": "string", "enum": OPS},
             "value": {"type": ["string", "number"]}}, "required": ["column", "op", "value"]}}
TOOLS = [
    {"type": "function", "function": {
        "name": "query", "description": "Return the rows of a table matching every condition.",
        "parameters": {"type": "object", "properties": {
            "table": {"type": "string", "enum": ["departments", "employees"]}, "where": WHERE},
            "required": ["table"]}}},
    {"type": "function", "function": {
        "name": "update", "description": "Set columns on every matching row; returns the count.",
        "parameters": {"type": "object", "properties": {
            "table": {"type": "string", "enum": ["departments", "employees"]}, "where": WHERE,
            "set": {"type": "object", "description": "column -> new value"}},
            "required": ["table", "where", "set"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Finish and report the number of employees changed.",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}},
                       "required": ["count"]}}},
]


def _resolve(specs, given):
    """The knob values of one episode: the given ones, the defaults for the rest, in range."""
    given = given if isinstance(given, dict) else {}
    out = {}
    for key, spec in specs.items():
        value = given.get(key, spec["default"])
        if spec["type"] == "int":
            value = min(spec["max"], max(spec["min"], int(value)))
        elif spec["type"] == "float":
            value = min(spec["max"], max(spec["min"], float(value)))
        elif spec["type"] == "bool":
            value = bool(value)
        elif value not in spec["choices"]:
            value = spec["default"]
        out[key] = value
    return out


def _call(tool, **arguments):
    return json.dumps({"tool": tool, "arguments": arguments})


def _parse_call(action):
    try:
        obj = json.loads(action)
    except Exception:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return None, None
    args = obj.get("arguments", {})
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except Exception:
            return obj["tool"], None
    return obj["tool"], args if isinstance(args, dict) else None


def _conditions(where, columns):
    """Normalise `where` into [(column, op, value)]; a dict means equality. Raises ValueError."""
    if where is None:
        return []
    if isinstance(where, dict):
        where = [{"column": k, "op": "=", "value": v} for k, v in where.items()]
    if not isinstance(where, list) or len(where) > 10:
        raise ValueError("'where' must be a list of {column, op, value} objects")
    out = []
    for cond in where:
        if isinstance(cond, list) and len(cond) == 3:
            cond = {"column": cond[0], "op": cond[1], "value": cond[2]}
        if not isinstance(cond, dict):
            raise ValueError("each condition must be an object {column, op, value}")
        col, op, val = cond.get("column"), cond.get("op", "="), cond.get("value")
        if col not in columns:
            raise ValueError(f"unknown column {str(col)[:30]!r}; columns: {', '.join(columns)}")
        if op == "==":
            op = "="
        if op not in OPS:
            raise ValueError(f"unknown op {str(op)[:10]!r}; ops: {' '.join(OPS)}")
        if isinstance(val, bool) or not isinstance(val, (str, int, float)):
            raise ValueError("condition values must be strings or numbers")
        out.append((col, op, val))
    return out


def _match(row, conds):
    for col, op, val in conds:
        x = row[col]
        if isinstance(x, int) and isinstance(val, str):
            try:
                val = float(val)
            except ValueError:
                return False
        if isinstance(x, str) != isinstance(val, str):
            return False
        ok = {"=": x == val, "!=": x != val, "<": x < val, "<=": x <= val, ">": x > val,
              ">=": x >= val}[op]
        if not ok:
            return False
    return True


class Environment:
    name = "table_database"
    description = (
        "Multi-turn tool use on a small database with two tables: departments(id, name, floor) "
        "and employees(id, name, dept_id, salary). Task: every employee of the department "
        "named in the task (by its floor, or by its id) whose salary is below the named minimum "
        "must get exactly that minimum salary; change nothing else. Then call submit with 'count', "
        "the number of employees whose salary you changed. Tools: query(table, where), "
        "update(table, where, set), submit(count); 'where' is a list of conditions like "
        "{\"column\": \"salary\", \"op\": \"<\", \"value\": 50000} (ops = != < <= > >=). Each "
        "reply must be one JSON tool call exactly like {\"tool\": \"query\", \"arguments\": "
        "{\"table\": \"departments\", \"where\": []}}. Submitting ends the episode and pays 1 "
        "only if both the table and the count are right."
    )
    max_turns = 8
    tools = TOOLS

    params = {
        "employees": {"type": "int", "min": 3, "max": 18, "default": 18,
                      "description": "employee rows (up to 6 in the asked department)"},
        "departments": {"type": "int", "min": 1, "max": 4, "default": 4,
                        "description": "department rows"},
        "below": {"type": "int", "min": 1, "max": 4, "default": 4,
                  "description": "most underpaid employees in the asked department (from 2 up, or "
                                 "exactly 1)"},
        "by_id": {"type": "bool", "default": False, "easy": True,
                  "description": "the task names the department's id (off: its floor, to be looked "
                                 "up)"},
        "show_format": {"type": "bool", "default": False, "easy": True,
                        "description": "the task shows the JSON form of each call it needs, "
                                       "with <placeholders> to fill in"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        nd, ne = knobs["departments"], knobs["employees"]
        names = rng.sample(DEPTS, nd)
        floors = rng.sample(range(1, 12), nd)
        dept_ids = rng.sample(range(10, 99), nd)
        self._tables = {"departments": [{"id": i, "name": n, "floor": f}
                                        for i, n, f in zip(dept_ids, names, floors)],
                        "employees": []}
        self._minimum = rng.randrange(52000, 70000, 500)
        people = rng.sample([f"{a} {b}" for a in FIRST for b in LAST], ne)
        target = rng.randrange(nd)
        mine = min(6, ne)  # the first rows belong to the asked department
        low = min(mine, rng.randint(min(2, knobs["below"]), knobs["below"]))
        emp_ids = rng.sample(range(100, 999), ne)
        for k, (eid, person) in enumerate(zip(emp_ids, people)):
            dept = target if k < mine else rng.randrange(nd)
            below = (k < low) if k < mine else rng.random() < 0.5
            salary = (rng.randrange(self._minimum - 15000, self._minimum, 250) if below
                      else rng.randrange(self._minimum, self._minimum + 40000, 250))
            self._tables["employees"].append({"id": eid, "name": person,
                                              "dept_id": dept_ids[dept], "salary": salary})
        self._tables["employees"].sort(key=lambda r: r["id"])
        self._dept_id, self._floor = dept_ids[target], floors[target]
        expected = [dict(r) for r in self._tables["employees"]]
        self._count = 0
        for r in expected:
            if r["dept_id"] == self._dept_id and r["salary"] < self._minimum:
                r["salary"] = self._minimum
                self._count += 1
        self._expected = expected
        self._original_depts = [dict(r) for r in self._tables["departments"]]
        self._turns = 0
        self._done = False
        self._by_id = knobs["by_id"]
        which = (f"department {self._dept_id} (dept_id {self._dept_id})" if self._by_id
                 else f"the department on floor {self._floor}")
        obs = (f"Task: employees of {which} earning less than {self._minimum} must be raised to "
               f"exactly {self._minimum}. Then submit the number of employees changed. Reply "
               "with one JSON tool call per turn.")
        if knobs["show_format"]:
            where = '[{"column": "<column>", "op": "<op>", "value": <value>}, ...]'
            calls = [] if self._by_id else [
                '{"tool": "query", "arguments": {"table": "<table>", "where": ' + where + '}}']
            calls += ['{"tool": "update", "arguments": {"table": "employees", "where": ' + where
                      + ', "set": {"salary": <value>}}}',
                      '{"tool": "submit", "arguments": {"count": <number>}}']
            obs += " The calls you need look like: " + " ".join(calls)
        return obs, {"floor": self._floor, "minimum": self._minimum, "knobs": knobs}

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self.max_turns
        self._done = term or trunc
        if trunc:
            obs += " Out of turns; the episode is over without a submit."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        tool, args = _parse_call(action)
        if tool is None:
            return ("Not a tool call. Reply with JSON like {\"tool\": \"query\", \"arguments\": "
                    "{\"table\": \"departments\", \"where\": []}}.", 0.0, False,
                    {"error": "not_a_tool_call"})
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        if tool not in ("query", "update", "submit"):
            return (f"Unknown tool {tool[:40]!r}; use query, update or submit.", 0.0, False,
                    {"error": "unknown_tool"})
        if tool == "submit":
            return self._submit(args.get("count"))
        table = args.get("table")
        if not isinstance(table, str) or table not in self._tables:
            return "Unknown table; use 'departments' or 'employees'.", 0.0, False, {
                "error": "bad_arguments"}
        rows = self._tables[table]
        columns = list(rows[0])
        try:
            conds = _conditions(args.get("where"), columns)
        except ValueError as exc:
            return f"{tool}: {exc}", 0.0, False, {"error": "bad_where"}
        hits = [r for r in rows if _match(r, conds)]
        if tool == "query":
            return json.dumps({"table": table, "rows": hits}), 0.0, False, {"rows": len(hits)}
        changes = args.get("set")
        if not isinstance(changes, dict) or not changes:
            return "update needs 'set', an object of column -> value.", 0.0, False, {
                "error": "bad_arguments"}
        changes = dict(changes)
        for col, val in changes.items():
            if isinstance(val, float) and val.is_integer() and col in ("salary", "dept_id",
                                                                       "floor"):
                changes[col] = val = int(val)
            if col not in columns or col == "id":
                return f"update: column {str(col)[:30]!r} cannot be set.", 0.0, False, {
                    "error": "bad_arguments"}
            if isinstance(val, bool) or not isinstance(val, type(rows[0][col])):
                return f"update: column {col} needs a value like {rows[0][col]!r}.", 0.0, \
                    False, {"error": "bad_arguments"}
        for r in hits:
            r.update(changes)
        return json.dumps({"updated": len(hits)}), 0.0, False, {"rows": len(hits)}

    def _submit(self, count):
        problems = []
        if isinstance(count, str) and count.strip().isdigit() and len(count.strip()) < 6:
            count = int(count.strip())
        if isinstance(count, bool) or not isinstance(count, int) or count != self._count:
            problems.append("the count is wrong")
        if self._tables["employees"] != self._expected:
            problems.append("the employees table is not as required")
        if self._tables["departments"] != self._original_depts:
            problems.append("the departments table was changed")
        if problems:
            return "Submitted, but " + "; ".join(problems) + ".", 0.0, True, {"success": False}
        return "Submitted: the table and the count are right.", 1.0, True, {"success": True}

    def hint(self):
        return (f"The department on floor {self._floor} has id {self._dept_id}; {self._count} of "
                "its employees are below the minimum.")

    def solution(self):
        where = [{"column": "dept_id", "op": "=", "value": self._dept_id},
                 {"column": "salary", "op": "<", "value": self._minimum}]
        lookup = [] if self._by_id else [_call(
            "query", table="departments",
            where=[{"column": "floor", "op": "=", "value": self._floor}])]
        return lookup + [
            _call("query", table="employees", where=where),
            _call("update", table="employees", where=where, set={"salary": self._minimum}),
            _call("submit", count=self._count)]
