"""Multi-turn tool use on a small in-memory file system: gather numbers from logs, write a report."""

import json
import random

TOOLS = [
    {"type": "function", "function": {
        "name": "ls", "description": "List a directory; subdirectories end with '/'.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "cat", "description": "Print the content of a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write", "description": "Create or overwrite a file; its directory must exist.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "mkdir", "description": "Create a directory; its parent must exist.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Declare the task done; the file system is then checked.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]
SUBDIRS = ["web", "api", "batch", "cache", "edge", "jobs", "mail", "auth"]
STEMS = ["access", "events", "server", "audit", "worker", "gateway", "metrics", "daily", "sync"]


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


def _template(tool, **placeholders):
    """A call's JSON form with <placeholders> for its arguments, as a task may show it."""
    return json.dumps({"tool": tool, "arguments": {k: f"<{v}>" for k, v in placeholders.items()}})


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


def _norm(path):
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
        return None
    parts = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    return "/" + "/".join(parts)


def _parent(path):
    return path.rsplit("/", 1)[0] or "/"


class Environment:
    name = "file_system"
    description = (
        "Multi-turn tool use on a small in-memory file system. The task names a metric and a "
        "report file. Each file whose name ends in '.log' anywhere under /data (directly in "
        "/data or in its subdirectories) contains one line '<metric>=<n>'. Compute the sum of "
        "those n over all .log files (ignore every other file), create the report file's "
        "directory if it does not exist, write the sum as a bare integer to the report file, do "
        "not modify anything under /data, then call submit. Tools: ls(path), cat(path), "
        "write(path, content), mkdir(path), submit(); paths are absolute. "
        "Each reply must be one JSON tool call exactly like {\"tool\": \"ls\", \"arguments\": "
        "{\"path\": \"/data\"}}. Submitting ends the episode and pays 1 only if the report is "
        "right."
    )
    max_turns = 12
    tools = TOOLS

    params = {
        "logs": {"type": "int", "min": 1, "max": 4, "default": 3,
                 "description": "log files to add up: one directly in /data, the rest one per "
                                "subdirectory"},
        "decoys": {"type": "bool", "default": True,
                   "description": "decoy .txt and .log.bak files holding the same metric"},
        "digits": {"type": "int", "min": 1, "max": 3, "default": 3,
                   "description": "digits of each logged value (1 means 2 to 9)"},
        "mkdir": {"type": "bool", "default": True,
                  "description": "the report's directory must be created (off: it exists)"},
        "paths_given": {"type": "bool", "default": False, "easy": True,
                        "description": "the task lists the log files' paths"},
        "show_format": {"type": "bool", "default": False, "easy": True,
                        "description": "the task shows the JSON form of each call it needs, "
                                       "with <placeholders> to fill in"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        subs = rng.sample(SUBDIRS, knobs["logs"] - 1)
        dirs = ["/", "/data"] + ["/data/" + sub for sub in subs] + ["/home"]
        metric = rng.choice(["requests", "errors", "retries", "timeouts", "bytes_sent"])
        others = [m for m in ["requests", "errors", "retries", "timeouts"] if m != metric]
        self._dir = rng.choice(["/report", "/out", "/summary", "/results"])
        self._report = self._dir + "/" + rng.choice(["total.txt", "sum.txt", metric + ".txt"])
        self._metric = metric
        digits = knobs["digits"]
        low, high = (2 if digits == 1 else 10 ** (digits - 1)), 10 ** digits - 1
        files = {"/home/notes.txt": f"remember: reports go to {self._dir}\n"}
        logs = []
        for d in dirs[1:-1]:
            stems = rng.sample(STEMS, 3)
            n = rng.randint(low, high)
            path = f"{d}/{stems[0]}.log"
            logs.append(path)
            files[path] = (f"host={rng.choice(SUBDIRS)}-{rng.randint(1, 9)}\n"
                           f"date=2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}\n"
                           f"{rng.choice(others)}={rng.randint(1, 99)}\n"
                           f"{metric}={n}\nstatus=ok\n")
            decoy = f"draft notes\n{metric}={rng.randint(low, high)}\n"
            if knobs["decoys"]:
                files[f"{d}/{stems[1]}.txt"] = decoy
            if rng.random() < 0.6 and knobs["decoys"]:
                files[f"{d}/{stems[2]}.log.bak"] = f"{metric}={rng.randint(low, high)}\nstale\n"
        if not knobs["mkdir"]:
            dirs.append(self._dir)
        self._dirs = list(dirs)
        self._files = files
        self._original = {k: v for k, v in files.items() if k.startswith("/data/")}
        self._logs = logs
        self._total = sum(int(files[p].split("\n" + metric + "=")[1].split("\n")[0])
                          for p in logs)
        self._subs = ["/data/" + s for s in subs]
        self._mkdir = knobs["mkdir"]
        self._turns = 0
        self._done = False
        where = (f"the .log files ({', '.join(logs)})" if knobs["paths_given"]
                 else "all .log files under /data")
        mounted = ("A file system with /data and /home is mounted." if knobs["mkdir"] else
                   f"A file system with /data, /home and {self._dir} is mounted.")
        obs = (f"Task: sum the '{metric}=' values of {where} and write the total to "
               f"{self._report}. {mounted} Reply with one JSON tool call per turn.")
        if knobs["show_format"]:
            calls = [] if knobs["paths_given"] else [_template("ls", path="directory")]
            calls.append(_template("cat", path="file"))
            calls += [_template("mkdir", path="directory")] if knobs["mkdir"] else []
            calls += [_template("write", path="file", content="text"), _call("submit")]
            obs += " The calls you need look like: " + " ".join(calls)
        return obs, {"metric": metric, "report": self._report, "knobs": knobs}

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
            return ("Not a tool call. Reply with JSON like {\"tool\": \"ls\", \"arguments\": "
                    "{\"path\": \"/data\"}}.", 0.0, False, {"error": "not_a_tool_call"})
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        if tool not in ("ls", "cat", "write", "mkdir", "submit"):
            return (f"Unknown tool {tool[:40]!r}; use ls, cat, write, mkdir or submit.", 0.0,
                    False, {"error": "unknown_tool"})
        if tool == "submit":
            return self._submit()
        path = _norm(args.get("path"))
        if path is None:
            return f"{tool} needs an absolute string 'path' such as '/data'.", 0.0, False, {
                "error": "bad_path"}
        info = {"tool": tool}
        if tool == "ls":
            if path not in self._dirs:
                return f"ls: {path}: no such directory", 0.0, False, info
            prefix = path.rstrip("/") + "/"
            names = [d[len(prefix):] + "/" for d in self._dirs
                     if d != path and _parent(d) == path]
            names += [f[len(prefix):] for f in self._files if _parent(f) == path]
            return json.dumps({"path": path, "entries": sorted(names)}), 0.0, False, info
        if tool == "cat":
            if path not in self._files:
                return f"cat: {path}: no such file", 0.0, False, info
            return self._files[path], 0.0, False, info
        if path in self._dirs:
            return f"{tool}: {path}: a directory with that name exists", 0.0, False, info
        if _parent(path) not in self._dirs:
            return f"{tool}: {_parent(path)}: no such directory", 0.0, False, info
        if tool == "mkdir":
            if path in self._files:
                return f"mkdir: {path}: a file with that name exists", 0.0, False, info
            self._dirs.append(path)
            return f"created directory {path}", 0.0, False, info
        content = args.get("content")
        if isinstance(content, bool) or not isinstance(content, (str, int, float)):
            return "write needs a string 'content'.", 0.0, False, {"error": "bad_arguments"}
        content = str(content)
        if len(content) > 2000 or len(self._files) >= 60:
            return "write: no space left (files are limited to 2000 characters).", 0.0, False, info
        self._files[path] = content
        return f"wrote {len(content)} characters to {path}", 0.0, False, info

    def _submit(self):
        problems = []
        if self._dir not in self._dirs:
            problems.append(f"{self._dir} is not a directory")
        got = self._files.get(self._report)
        if got is None:
            problems.append(f"{self._report} does not exist")
        elif got.strip() != str(self._total):
            problems.append(f"{self._report} does not hold the right total")
        now = {k: v for k, v in self._files.items() if k.startswith("/data/")}
        if now != self._original:
            problems.append("files under /data were modified")
        if problems:
            return "Submitted, but " + "; ".join(problems) + ".", 0.0, True, {"success": False}
        return "Submitted: the report is right.", 1.0, True, {"success": True}

    def hint(self):
        return ("The .log files are " + ", ".join(self._logs) + " (the .log.bak and .txt files "
                "do not count).")

    def solution(self):
        moves = [_call("ls", path="/data")] + [_call("ls", path=s) for s in self._subs]
        moves += [_call("cat", path=p) for p in self._logs]
        if self._mkdir:
            moves.append(_call("mkdir", path=self._dir))
        moves += [_call("write", path=self._report, content=str(self._total)),
                  _call("submit")]
        return moves
