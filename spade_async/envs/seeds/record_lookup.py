"""Multi-turn tool use on a staff directory: look records up along manager links, report a number."""

import json
import random
import re

TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "description": "Return the directory record of one person by full name.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Report the final number; this ends the episode.",
        "parameters": {"type": "object", "properties": {"value": {"type": "integer"}},
                       "required": ["value"]}}},
]
FIRST = "Ada Ben Cleo Dan Eve Finn Gia Hugo Iris Jack Kara Leo Mia Nico Olga Paul".split()
LAST = "Park Stone Reyes Okafor Novak Lind Mori Haas Diaz Berg".split()
# Each field's values share one range, so only the field's name tells them apart.
FIELDS = ["badge", "room", "desk", "locker"]
STAFF = 4  # people off the chain: managers of its last person, never asked about


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


def _last_int(text):
    found = re.findall(r"-?\d+", text)
    if not found or len(found[-1]) > 30:
        return None
    return int(found[-1])


class Environment:
    name = "record_lookup"
    description = (
        "Multi-turn tool use on a staff directory. The task asks for one number field (such as "
        "badge or room) of a person, who is either named or reached through manager links (the "
        "manager of the named person, and so on). lookup(name) returns a person's record as "
        "JSON, with the manager's name. Look up the records you need, then report the number: "
        "reply with it as plain text (the last integer of a reply that is not a tool call is "
        "taken as the answer), or call answer(value). Tool calls are one JSON object per reply, "
        "exactly like {\"tool\": \"lookup\", \"arguments\": {\"name\": \"Ada Park\"}}. The "
        "first answer ends the episode and pays 1 if it is right."
    )
    max_turns = 8
    tools = TOOLS
    params = {
        "hops": {"type": "int", "min": 1, "max": 4, "default": 2,
                 "description": "lookups needed: 1 asks about the named person, each more follows "
                                "one manager link"},
        "fields": {"type": "int", "min": 1, "max": 4, "default": 3,
                   "description": "number fields per record (all but the asked one are "
                                  "distractors)"},
        "show_call": {"type": "bool", "default": False, "easy": True,
                      "description": "the task spells out the first tool call in full"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        hops = knobs["hops"]
        names = rng.sample([f"{a} {b}" for a in FIRST for b in LAST], hops + STAFF)
        chain, others = names[:hops], names[hops:]
        fields = FIELDS[:knobs["fields"]]
        self._field = rng.choice(fields)
        records = {}
        for i, person in enumerate(names):
            # along the chain each person's manager is the next; the rest report off the chain
            manager = chain[i + 1] if i < hops - 1 else rng.choice(
                [n for n in others if n != person])
            record = {"name": person, "manager": manager}
            for f in fields:
                record[f] = rng.randint(100, 999)
            records[person] = record
        self._records = records
        self._chain = chain
        self._answer = records[chain[-1]][self._field]
        self._budget = hops + 3
        self._question = (f"What is the {self._field} number of "
                          f"{'the manager of ' * (hops - 1)}{chain[0]}?")
        obs = (f"{self._question} Look records up with the lookup tool, one JSON tool call per "
               f"reply, then reply with the number. You have {self._budget} replies.")
        if knobs["show_call"]:
            obs += " Your first reply should be exactly: " + _call("lookup", name=chain[0])
        self._turns = 0
        self._done = False
        return obs, {"field": self._field, "start": chain[0], "hops": hops, "knobs": knobs}

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self._budget
        self._done = term or trunc
        if trunc:
            obs += " Out of replies; the episode is over without an answer."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        tool, args = _parse_call(action)
        if tool is None:
            value = _last_int(action)
            if value is None:
                return ("Reply with a JSON tool call, or with the number you found.", 0.0, False,
                        {"error": "no_answer"})
            return self._judge(value)
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        if tool == "answer":
            value = args.get("value")
            if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,12}\s*", value):
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                return "answer needs an integer 'value'.", 0.0, False, {"error": "bad_arguments"}
            return self._judge(value)
        if tool != "lookup":
            return (f"Unknown tool {tool[:40]!r}; use lookup or answer.", 0.0, False,
                    {"error": "unknown_tool"})
        name = args.get("name")
        if not isinstance(name, str) or not name.strip():
            return "lookup needs a string 'name'.", 0.0, False, {"error": "bad_arguments"}
        wanted = " ".join(name.split()).lower()
        for person, record in self._records.items():
            if person.lower() == wanted:
                return json.dumps(record), 0.0, False, {"tool": "lookup"}
        return json.dumps({"error": f"no person named {name.strip()[:60]}"}), 0.0, False, {
            "tool": "lookup"}

    def _judge(self, value):
        if value == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return f"Incorrect: {value} is not the number asked for.", 0.0, True, {"correct": False}

    def hint(self):
        if len(self._chain) == 1:
            return (f"Look up {self._chain[0]} and read the '{self._field}' field of the record "
                    "(not the other numbers).")
        return (f"The manager chain is {' -> '.join(self._chain)}; the answer is the "
                f"'{self._field}' field of {self._chain[-1]}'s record.")

    def solution(self):
        moves = [_call("lookup", name=person) for person in self._chain]
        return moves + [f"ANSWER: {self._answer}"]
