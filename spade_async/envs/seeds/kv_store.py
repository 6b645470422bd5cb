"""Multi-turn tool use on a key-value store: follow a pointer chain, record the result, clean up."""

import json
import random
import string

TOOLS = [
    {"type": "function", "function": {
        "name": "get", "description": "Read the value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}},
    {"type": "function", "function": {
        "name": "set", "description": "Store a string value under a key (creates or overwrites).",
        "parameters": {"type": "object", "properties": {
            "key": {"type": "string"}, "value": {"type": "string"}}, "required": ["key", "value"]}}},
    {"type": "function", "function": {
        "name": "delete", "description": "Delete a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}},
    {"type": "function", "function": {
        "name": "list", "description": "List the keys that start with a prefix (all keys if empty).",
        "parameters": {"type": "object", "properties": {"prefix": {"type": "string"}},
                       "required": []}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Declare the task done; the store is then checked.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]
WORDS = ["amber", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "jade",
         "kelp", "lotus", "mesa", "nectar", "onyx", "prairie", "quartz", "russet", "sierra"]


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


class Environment:
    name = "kv_store"
    description = (
        "Multi-turn tool use on a key-value store whose keys and values are strings. The task "
        "names a start key, a result key and a junk prefix. The start key's value is a pointer "
        "of the form '-> <key>'. Follow the pointers until you reach a value of the form "
        "'final:<token>'. Then set the result key to <token> (without the 'final:' prefix), "
        "delete every key whose name starts with the junk prefix, leave every other key "
        "untouched, and call submit (unless the task says setting the result key ends the "
        "episode). Act only through tool calls, each reply being one JSON "
        "object exactly like {\"tool\": \"get\", \"arguments\": {\"key\": \"start\"}}; the "
        "tools are get, set, delete, list and submit. Submitting ends the episode; it pays 1 "
        "only if the store is exactly right."
    )
    max_turns = 12
    tools = TOOLS

    params = {
        "hops": {"type": "int", "min": 0, "max": 4, "default": 2,
                 "description": "pointer keys between the start key and the final value (0: the "
                                "start key holds it)"},
        "decoys": {"type": "int", "min": 0, "max": 9, "default": 9,
                   "description": "decoy node keys (final values and pointers off the chain)"},
        "junk": {"type": "int", "min": 0, "max": 3, "default": 3,
                 "description": "most junk keys to delete (at least junk - 1)"},
        "submit": {"type": "bool", "default": True,
                   "description": "finish with submit (off: the first set of the result key ends "
                                  "the episode and is checked)"},
        "show_format": {"type": "bool", "default": False, "easy": True,
                        "description": "the task shows the JSON form of each call it needs, "
                                       "with <placeholders> to fill in"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        alphabet = string.ascii_lowercase + string.digits
        hops = knobs["hops"]
        names = []
        while len(names) < hops + knobs["decoys"]:
            k = "node:" + "".join(rng.choice(alphabet) for _ in range(4))
            if k not in names:
                names.append(k)
        tokens = []
        while len(tokens) < 5:
            t = f"{rng.choice(WORDS)}-{rng.randint(100, 999)}"
            if t not in tokens:
                tokens.append(t)
        chain = names[:hops]
        self._entry = rng.choice(["entry", "start", "head", "root", "begin"])
        self._entry += "-" + rng.choice(alphabet) + rng.choice(alphabet)
        self._result = rng.choice(["result", "answer", "output", "found", "token"])
        self._junk = rng.choice(["tmp:", "scratch:", "cache:", "draft:", "old:"])
        path = [self._entry] + chain
        store = {k: "-> " + nxt for k, nxt in zip(path, path[1:])}
        store[path[-1]] = "final:" + tokens[0]
        decoys = names[hops:]
        for i, k in enumerate(decoys):
            if i < 4:
                store[k] = "final:" + tokens[i + 1]
            else:
                store[k] = "-> " + rng.choice(decoys[:i])
        self._tmp = []
        for _ in range(rng.randint(max(0, knobs["junk"] - 1), knobs["junk"])):
            k = self._junk + "".join(rng.choice(alphabet) for _ in range(3))
            if k not in self._tmp:
                self._tmp.append(k)
        self._tmp.sort()
        for k in self._tmp:
            store[k] = "scratch " + str(rng.randint(1000, 9999))
        keys = sorted(store)
        rng.shuffle(keys)
        self._store = {k: store[k] for k in keys}
        self._original = dict(self._store)
        self._chain, self._token = chain, tokens[0]
        self._need_submit = knobs["submit"]
        self._turns = 0
        self._done = False
        keys = "key" if len(self._store) == 1 else "keys"
        obs = (f"The store holds {len(self._store)} {keys}. Start key: '{self._entry}'. Result "
               f"key: '{self._result}'. Junk prefix: '{self._junk}'.")
        if not self._need_submit:
            obs += " Setting the result key ends the episode and checks the store at once."
        obs += " Reply with one JSON tool call per turn."
        if knobs["show_format"]:
            calls = [_template("get", key="key"), _template("set", key="key", value="value")]
            calls += [_template("delete", key="key")] if self._tmp else []
            calls += [_call("submit")] if self._need_submit else []
            obs += " The calls you need look like: " + " ".join(calls)
        return obs, {"keys": len(self._store), "start_key": self._entry,
                     "result_key": self._result, "junk_prefix": self._junk, "knobs": knobs}

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
            return ("Not a tool call. Reply with JSON like {\"tool\": \"get\", \"arguments\": "
                    "{\"key\": \"start\"}}.", 0.0, False, {"error": "not_a_tool_call"})
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        if tool not in ("get", "set", "delete", "list", "submit"):
            return (f"Unknown tool {tool[:40]!r}; use get, set, delete, list or submit.", 0.0,
                    False, {"error": "unknown_tool"})
        if tool == "submit":
            return self._submit()
        if tool == "list":
            prefix = args.get("prefix", "")
            prefix = prefix if isinstance(prefix, str) else str(prefix)
            keys = sorted(k for k in self._store if k.startswith(prefix))
            return json.dumps({"keys": keys}), 0.0, False, {"tool": "list"}
        key = args.get("key")
        if not isinstance(key, str) or not key:
            return f"{tool} needs a non-empty string argument 'key'.", 0.0, False, {
                "error": "bad_arguments"}
        key = key[:100]
        if tool == "get":
            if key not in self._store:
                return json.dumps({"error": f"no such key: {key}"}), 0.0, False, {"tool": "get"}
            return json.dumps({"key": key, "value": self._store[key]}), 0.0, False, {"tool": "get"}
        if tool == "delete":
            if key not in self._store:
                return json.dumps({"error": f"no such key: {key}"}), 0.0, False, {
                    "tool": "delete"}
            del self._store[key]
            return json.dumps({"deleted": key}), 0.0, False, {"tool": "delete"}
        value = args.get("value")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return "set needs a string argument 'value'.", 0.0, False, {"error": "bad_arguments"}
        value = str(value)
        if len(value) > 500:
            return "Values are limited to 500 characters.", 0.0, False, {"error": "too_long"}
        self._store[key] = value
        done = json.dumps({"ok": True, "key": key})
        if key == self._result and not self._need_submit:
            obs, reward, term, info = self._submit()
            return done + " " + obs, reward, term, info
        return done, 0.0, False, {"tool": "set"}

    def _submit(self):
        problems = []
        junk = self._junk
        if self._store.get(self._result) != self._token:
            problems.append(f"'{self._result}' does not hold the token at the end of the chain")
        if any(k.startswith(junk) for k in self._store):
            problems.append(f"some {junk} keys remain")
        expect = {k: v for k, v in self._original.items() if not k.startswith(junk)}
        now = {k: v for k, v in self._store.items()
               if k != self._result and not k.startswith(junk)}
        if now != expect:
            problems.append("other keys were changed, added or deleted")
        if problems:
            return "Submitted, but " + "; ".join(problems) + ".", 0.0, True, {"success": False}
        return "Submitted: the store is exactly right.", 1.0, True, {"success": True}

    def hint(self):
        path = [self._entry] + self._chain
        text = (f"The chain is {' -> '.join(path)}; the key {path[-1]} holds the final value."
                if self._chain else f"The start key {self._entry} holds the final value itself.")
        if self._tmp:
            return text + f" The keys to delete are {', '.join(self._tmp)}."
        return text + " There are no junk keys to delete."

    def solution(self):
        moves = [_call("list", prefix=self._junk), _call("get", key=self._entry)]
        moves += [_call("get", key=k) for k in self._chain]
        deletes = [_call("delete", key=k) for k in self._tmp]
        setting = _call("set", key=self._result, value=self._token)
        if not self._need_submit:  # the set ends the episode: clean up first
            return moves + deletes + [setting]
        return moves + [setting] + deletes + [_call("submit")]
