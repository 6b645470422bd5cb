"""The sandbox worker: the only code that runs beside a generated environment.

Executed inside the isolation layer as `python3 -I -S -c <this file's text> <limits json>`, so it
must use the standard library only and import nothing from spade_async. It applies the rlimits,
moves the protocol off stdout (fd 1 and 2 point at /dev/null, so a `print` cannot forge or flood a
response), then serves one JSON object per line on stdin/stdout:

    {"id": 1, "op": "load", "code": "..."}      -> {"id": 1, "ok": true, "result": {meta}}
                                                   (meta["params"]: the raw knobs, {} if none)
    {"id": 2, "op": "reset", "seed": 0}         -> {"id": 2, "ok": true, "result": {...}}
    {"id": 2, "op": "reset", "seed": 0, "params": {"digits": 4}}   (env.reset(0, {"digits": 4}))
    {"id": 3, "op": "step", "action": "..."}    ... "hint", "solution", "close"
    failures: {"id": n, "ok": false, "kind": "...", "error": "...", "traceback": "..."}

Everything it sends back is re-checked by the daemon: the environment runs in this process and
may have tampered with it. It never holds a secret worth stealing.
"""

import builtins
import json
import os
import resource
import sys

ALLOWED = set()
MAX_TRACE = 4000


def _apply_limits(limits):
    pairs = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_AS, limits["address_space_bytes"]),
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
    ]
    for which, value in pairs:
        if value is None:
            continue
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and value > hard:
            value = hard
        resource.setrlimit(which, (value, value))


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level != 0 or name.split(".")[0] not in ALLOWED:
        raise ImportError(f"import of '{name}' is not allowed in an environment "
                          f"(allowed: {', '.join(sorted(ALLOWED))})")
    return builtins.__import__(name, globals, locals, fromlist, level)


_REMOVED = ("open", "eval", "exec", "compile", "input", "breakpoint", "help", "exit", "quit",
            "globals", "vars", "memoryview", "copyright", "credits", "license")


def _env_builtins():
    safe = {k: v for k, v in builtins.__dict__.items() if k not in _REMOVED}
    safe["__import__"] = _guarded_import
    return safe


SOURCE_LINES = []


def _trace(exc):
    """The environment's frames only, without importing traceback (which may be impossible
    right now: the environment may have used up every file descriptor)."""
    lines = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == "<environment>":
            n = tb.tb_lineno
            src = SOURCE_LINES[n - 1].strip() if 0 < n <= len(SOURCE_LINES) else ""
            lines.append(f"  line {n}, in {code.co_name}: {src}".rstrip())
        tb = tb.tb_next
    text = "\n".join(lines[-8:] + [f"{type(exc).__name__}: {exc}"])
    return text[-MAX_TRACE:]


class _Session:
    def __init__(self):
        self.env = None

    def load(self, req):
        SOURCE_LINES[:] = req["code"].splitlines()
        code = compile(req["code"], "<environment>", "exec")
        ns = {"__name__": "environment", "__builtins__": _env_builtins()}
        exec(code, ns)
        cls = ns.get("Environment")
        if not isinstance(cls, type):
            raise TypeError("the module must define a class named Environment")
        self.env = cls()
        env = self.env
        params = getattr(env, "params", None)
        return {
            "name": getattr(env, "name", None),
            "description": getattr(env, "description", None),
            "max_turns": getattr(env, "max_turns", 8),
            "tools": list(getattr(env, "tools", None) or []),
            "has_solution": callable(getattr(env, "solution", None)),
            "params": {} if params is None else params,
        }

    def _need_env(self):
        if self.env is None:
            raise RuntimeError("no environment loaded")
        return self.env

    def reset(self, req):
        # The knobs go positionally, and only when the daemon sends them: an environment
        # without knobs keeps its one-argument reset(seed).
        params = req.get("params")
        if params is None:
            out = self._need_env().reset(int(req["seed"]))
        elif isinstance(params, dict):
            out = self._need_env().reset(int(req["seed"]), params)
        else:
            raise TypeError(f"reset params must be a dict, got {type(params).__name__}")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"reset() must return (observation, info), got {_shape(out)}")
        return {"observation": out[0], "info": out[1]}

    def step(self, req):
        out = self._need_env().step(req["action"])
        if not isinstance(out, (tuple, list)) or len(out) != 5:
            raise TypeError("step() must return (observation, reward, terminated, truncated, "
                            f"info), got {_shape(out)}")
        obs, reward, term, trunc, info = out
        if hasattr(reward, "__float__") and not isinstance(reward, (bool, int, float)):
            reward = float(reward)  # Fraction, Decimal
        return {"observation": obs, "reward": reward, "terminated": term, "truncated": trunc,
                "info": info}

    def hint(self, req):
        return {"hint": self._need_env().hint()}

    def solution(self, req):
        fn = getattr(self._need_env(), "solution", None)
        if not callable(fn):
            raise AttributeError("the environment has no solution() method")
        actions = fn()
        if not isinstance(actions, (list, tuple)):
            raise TypeError(f"solution() must return a list of action strings, got {_shape(actions)}")
        return {"actions": list(actions)}


def _shape(value):
    if isinstance(value, (tuple, list)):
        return f"a {len(value)}-item {type(value).__name__}"
    return type(value).__name__


def main():
    limits = json.loads(sys.argv[1])
    ALLOWED.update(limits["allowed_imports"])
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    _apply_limits(limits)
    if limits.get("preload"):
        for name in sorted(ALLOWED):
            try:
                __import__(name)
            except ImportError:
                pass
    session = _Session()

    def send(obj):
        try:
            data = json.dumps(obj, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            data = json.dumps({"id": obj.get("id"), "ok": False, "kind": "contract",
                               "error": f"{obj.get('op', 'result')} is not JSON-serializable: {exc}"})
        proto_out.write(data.encode("utf-8", "surrogatepass") + b"\n")
        proto_out.flush()

    send({"id": 0, "ok": True, "result": {"ready": True, "pid": os.getpid(), "uid": os.getuid()}})
    while True:
        line = proto_in.readline()
        if not line:
            return
        try:
            req = json.loads(line)
            rid, op = req["id"], req["op"]
        except (ValueError, KeyError, TypeError) as exc:
            send({"id": None, "ok": False, "kind": "protocol", "error": f"bad request: {exc}"})
            continue
        if op == "close":
            send({"id": rid, "ok": True, "result": {}})
            return
        handler = getattr(session, op, None) if op in ("load", "reset", "step", "hint",
                                                         "solution") else None
        if handler is None:
            send({"id": rid, "ok": False, "kind": "protocol", "error": f"unknown op {op!r}"})
            continue
        try:
            result = handler(req)
        except BaseException as exc:  # the environment's SystemExit too: report, keep serving
            kind = "syntax" if isinstance(exc, SyntaxError) else "exception"
            msg = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, SyntaxError):
                msg = f"SyntaxError: {exc.msg} (line {exc.lineno})"
            try:
                trace = _trace(exc)
            except BaseException:
                trace = ""
            send({"id": rid, "ok": False, "kind": kind, "error": f"{op}: {msg}"[:2000],
                  "traceback": trace})
            continue
        send({"id": rid, "ok": True, "op": op, "result": result})


main()
