"""BFCL multi-turn worker: runs under `.venv-bfcl/bin/python` (bfcl-eval installed --no-deps, see
scripts/setup-bfcl.sh), never under the spade venv, so it imports only the standard library and
bfcl_eval. It speaks JSON lines on stdin/stdout: one request object in, one reply object out,
`{"result": ...}` or `{"error": "..."}`.

One process holds at most one episode (a "session") at a time:
  entries   {category, ids?}        -> [{id, turns, classes, questions}] in the category's file
                                       order (questions: the user's text per turn, "" for none)
  reset     {category, id, docs?}   -> a fresh episode of that entry: its tools and first question
  tools     {docs?}                 -> the tools the model may call in the current turn
  call      {name, arguments}       -> {result, executed}: one function call on the live backends
  end_turn  {}                      -> {done, observation, new_tools}: the user's next turn
  check     {}                      -> {valid, error_type, error_message, details}: bfcl's verdict
  ground_truth {category, id}       -> per turn, the reference calls as {"tool", "arguments"}

Security: bfcl's executor and checker eval() call strings. This worker never passes them any text
it was sent: it builds every call string itself as `name(key=<repr of a JSON value>, ...)` from a
function name that must be one of the entry's functions and keys that must be identifiers, so
what bfcl evaluates is a method call whose arguments are Python literals.

State: bfcl caches backend instances in `multi_turn_utils` module globals keyed by model name and
entry id. Every reset uses a new, unique model name and drops the previous session's instances,
so no state carries from one episode to the next.
"""

from __future__ import annotations

import ast
import atexit
import copy
import inspect
import json
import keyword
import math
import os
import shutil
import sys
import tempfile
import uuid
from typing import Any

# bfcl_eval.constants.eval_config (imported by parts of the package) creates result/, score/ and
# .file_locks/ under BFCL_PROJECT_ROOT, by default site-packages: point it at a scratch dir.
_SCRATCH = tempfile.mkdtemp(prefix="spade-bfcl-")
os.environ["BFCL_PROJECT_ROOT"] = _SCRATCH
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)

from importlib.resources import files  # noqa: E402

from bfcl_eval.constants.default_prompts import (  # noqa: E402
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
)
from bfcl_eval.constants.executable_backend_config import (  # noqa: E402
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
)
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as mtu  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (  # noqa: E402
    multi_turn_checker,
)

DATA = files("bfcl_eval") / "data"
CATEGORIES = ("base", "long_context", "miss_param", "miss_func")
# The backends of the multi-turn categories (memory_* and web_search need packages and network
# that this venv does not have).
SUPPORTED_CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI",
                     "TradingBot", "TravelAPI", "VehicleControlAPI")
MAX_ARG_DEPTH = 16
MAX_ARG_CHARS = 100_000
MAX_DETAIL_CHARS = 4000


class RequestError(Exception):
    """A malformed request: answered with {"error": ...}, the worker carries on."""


def _jsonl(path: Any) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


_entries: dict[str, dict[str, dict[str, Any]]] = {}  # category -> id -> entry (file order)
_truth: dict[str, dict[str, list[list[str]]]] = {}
_docs: dict[str, list[dict[str, Any]]] = {}


def _category(cat: Any) -> str:
    if cat not in CATEGORIES:
        raise RequestError(f"unknown BFCL multi-turn category {cat!r}: one of {list(CATEGORIES)}")
    return cat


def entries(cat: str) -> dict[str, dict[str, Any]]:
    cat = _category(cat)
    if cat not in _entries:
        name = f"BFCL_v4_multi_turn_{cat}.json"
        _entries[cat] = {e["id"]: e for e in _jsonl(DATA / name)}
        _truth[cat] = {g["id"]: g["ground_truth"] for g in _jsonl(DATA / "possible_answer" / name)}
    return _entries[cat]


def entry(cat: str, entry_id: Any) -> dict[str, Any]:
    found = entries(cat).get(entry_id)
    if found is None:
        raise RequestError(f"no entry {entry_id!r} in BFCL multi_turn_{cat}")
    return found


def class_docs(cls: str) -> list[dict[str, Any]]:
    if cls not in _docs:
        _docs[cls] = _jsonl(DATA / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])
    return _docs[cls]


def user_texts(e: dict[str, Any]) -> list[str]:
    """The user's message of each turn ("" for a miss_func turn that has none)."""
    return ["\n\n".join(m["content"] for m in turn if m.get("role") == "user")
            for turn in e["question"]]


def question_texts(e: dict[str, Any]) -> list[str]:
    """One text per turn: the user's message, or for a miss_func turn that brings back a held-out
    function (no user message there) bfcl's own prompt for it."""
    return [text or DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC for text in user_texts(e)]


# ---- tool schemas ---------------------------------------------------------------------------

def _openapi(schema: Any) -> Any:
    """bfcl's types (dict, float, tuple, any, ...) as JSON-schema types, recursively, the way
    bfcl's own `convert_to_tool` maps them for OpenAI-style tools."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    t = out.get("type")
    if isinstance(t, str):
        if t == "float":
            out["format"] = "float"
            if isinstance(out.get("description"), str):
                out["description"] += " This is a float type value."
        out["type"] = GORILLA_TO_OPENAPI.get(t, "string")
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _openapi(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _openapi(out["items"])
    return out


def _brief(schema: Any) -> Any:
    """The schema without parameter descriptions (a small-context variant, not the benchmark's)."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "description"}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _brief(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _brief(out["items"])
    return out


def to_tool(doc: dict[str, Any], docs: str) -> dict[str, Any]:
    params = _openapi(copy.deepcopy(doc.get("parameters") or {}))
    params["type"] = "object"
    params.setdefault("properties", {})
    description = doc.get("description", "")
    if docs == "brief":
        params = _brief(params)
        params["type"] = "object"
        # "This tool belongs to <system>. ... Tool description: <what it does>. <details>"
        description = description.split("Tool description:", 1)[-1].strip()
        description = description.split(". ")[0].strip().rstrip(".") + "."
    return {"type": "function",
            "function": {"name": doc["name"], "description": description, "parameters": params}}


# ---- one episode ----------------------------------------------------------------------------

class Session:
    def __init__(self, cat: str, e: dict[str, Any], docs: str) -> None:
        if docs not in ("full", "brief"):
            raise RequestError(f"docs must be 'full' or 'brief', got {docs!r}")
        unknown = [c for c in e["involved_classes"] if c not in SUPPORTED_CLASSES]
        if unknown:
            raise RequestError(f"{e['id']} uses backends this worker does not support: {unknown}")
        self.cat, self.entry, self.docs = cat, e, docs
        self.ground_truth = _truth[cat][e["id"]]
        # The executor prefixes instances with this name; it must start with a letter that makes
        # no escape sequence when its regex edits text inside a string literal ("\s" stays "\s").
        self.model_name = f"spade_{uuid.uuid4().hex}"
        self.questions = question_texts(e)
        self.turn = 0
        self.done = False
        self.calls: list[list[list[str]]] = [[]]  # turn -> step -> call strings (1 call a step)
        # miss_func: {"3": ["sort"]} -> the function is not offered before turn 3.
        self.held_out: dict[int, list[str]] = {
            int(t): list(names) for t, names in (e.get("missed_function") or {}).items()}
        self.all_docs = {d["name"]: d for c in e["involved_classes"] for d in class_docs(c)}
        self.long_context = "long_context" in cat
        # Instantiate the backends now (an empty call list), as bfcl's inference loop does.
        _, self.instances = self._execute([])

    def _execute(self, calls: list[str]) -> tuple[list[str], dict[str, Any]]:
        return mtu.execute_multi_turn_func_call(
            calls, self.entry["initial_config"], self.entry["involved_classes"],
            self.model_name, self.entry["id"], long_context=self.long_context)

    def available(self) -> list[str]:
        """Function names offered in the current turn (file order)."""
        hidden = {n for t, names in self.held_out.items() if t > self.turn for n in names}
        return [n for n in self.all_docs if n not in hidden]

    def tools(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        chosen = self.available() if names is None else names
        return [to_tool(self.all_docs[n], self.docs) for n in chosen if n in self.all_docs]

    def method(self, name: str) -> Any:
        for inst in self.instances.values():
            fn = getattr(inst, name, None)
            if callable(fn) and not name.startswith("_"):
                return fn
        return None

    def call(self, name: Any, arguments: Any) -> dict[str, Any]:
        if self.done:
            raise RequestError("the episode is over")
        # Any of the entry's functions may be called: like bfcl, miss_func only hides a held-out
        # function's doc until its turn (one ground truth even calls one before that turn).
        try:
            text = build_call(name, arguments, list(self.all_docs))
        except ValueError as exc:
            return {"result": f"Error: {exc}", "executed": False}
        results, _ = self._execute([text])
        self.calls[self.turn].append([text])
        return {"result": results[0], "executed": True, "call": text}

    def end_turn(self) -> dict[str, Any]:
        if self.done:
            raise RequestError("the episode is over")
        self.turn += 1
        if self.turn >= len(self.questions):
            self.done = True
            return {"done": True, "observation": "", "new_tools": []}
        self.calls.append([])
        new = self.held_out.get(self.turn, [])
        observation = self.questions[self.turn]
        if new:  # bfcl's prompting form: the new functions' docs, then its message
            observation = (json.dumps([t["function"] for t in self.tools(new)], ensure_ascii=False)
                           + "\n" + observation)
        return {"done": False, "observation": observation, "new_tools": self.tools(new)}

    def check(self) -> dict[str, Any]:
        name = f"{self.model_name}_check"
        try:
            if len(self.calls) != len(self.ground_truth) or not self.done:
                # bfcl fails an entry whose turns do not all complete (eval_runner's rule).
                return {"valid": False, "error_type": "multi_turn:force_terminated",
                        "error_message": f"the episode ended after {len(self.calls)} of "
                                         f"{len(self.ground_truth)} turns", "details": {}}
            verdict = multi_turn_checker(copy.deepcopy(self.calls), self.ground_truth,
                                         copy.deepcopy(self.entry), f"multi_turn_{self.cat}", name)
        finally:
            drop_instances(name)
        out = {"valid": bool(verdict.get("valid")), "error_type": verdict.get("error_type"),
               "error_message": verdict.get("error_message")}
        details = {k: v for k, v in verdict.items() if k not in out}
        text = json.dumps(details, default=str, ensure_ascii=False)
        out["details"] = details if len(text) <= MAX_DETAIL_CHARS else {
            "truncated": text[:MAX_DETAIL_CHARS]}
        return out

    def close(self) -> None:
        drop_instances(self.model_name)


def drop_instances(model_name: str) -> None:
    """Forget bfcl's cached backend instances of one model name (live, _eval, ground truth)."""
    prefix = model_name.replace("-", "_")
    for key in [k for k in vars(mtu) if k.startswith(prefix) and k.endswith("_instance")]:
        del vars(mtu)[key]


# ---- building call strings ------------------------------------------------------------------

def _literal(value: Any, depth: int = 0) -> Any:
    """A JSON value, checked: only JSON types, finite numbers, string keys, bounded depth."""
    if depth > MAX_ARG_DEPTH:
        raise ValueError("arguments are nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("arguments must be finite numbers")
        return value
    if isinstance(value, list):
        return [_literal(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("object keys must be strings")
        return {k: _literal(v, depth + 1) for k, v in value.items()}
    raise ValueError(f"unsupported argument type {type(value).__name__}")


def build_call(name: Any, arguments: Any, allowed: list[str]) -> str:
    """`name(key=repr(value), ...)`: the only form of call string this worker hands to bfcl."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"{str(name)[:80]!r} is not a function name")
    if name not in allowed:
        raise ValueError(f"no function named {name!r} is available; the functions are: "
                         + ", ".join(allowed))
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object of parameter names to values")
    parts = []
    for key, value in arguments.items():
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise ValueError(f"{str(key)[:80]!r} is not a parameter name")
        parts.append(f"{key}={_literal(value)!r}")
    text = f"{name}({', '.join(parts)})"
    if len(text) > MAX_ARG_CHARS:
        raise ValueError(f"the call is longer than {MAX_ARG_CHARS} characters")
    # Belt and braces: what bfcl will eval must parse as exactly that call of literals.
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            and all(k.arg for k in node.keywords)):
        raise ValueError("internal: the call did not render as name(key=literal, ...)")
    for k in node.keywords:
        ast.literal_eval(k.value)
    return text


def parse_reference_call(text: str, session: Session) -> dict[str, Any]:
    """A ground-truth call string (`sort('a.pdf')`, `cd(folder='x')`) as {"tool", "arguments"},
    parsed with ast (never evaluated); positional arguments get the method's parameter names."""
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise RequestError(f"cannot parse reference call {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        fn = session.method(name)
        if fn is None:
            raise RequestError(f"reference call {text!r} names no backend method")
        params = list(inspect.signature(fn).parameters)
        for pname, value in zip(params, node.args, strict=False):
            args[pname] = ast.literal_eval(value)
    for k in node.keywords:
        args[k.arg] = ast.literal_eval(k.value)
    return {"tool": name, "arguments": args}


# ---- the loop -------------------------------------------------------------------------------

_session: Session | None = None


def _need_session() -> Session:
    if _session is None:
        raise RequestError("no episode: send reset first")
    return _session


def handle(req: dict[str, Any]) -> Any:
    global _session
    op = req.get("op")
    if op == "ping":
        return {"pong": True, "bfcl_project_root": _SCRATCH}
    if op == "entries":
        cat = _category(req.get("category"))
        ids = req.get("ids")
        chosen = list(entries(cat).values()) if ids is None else [entry(cat, i) for i in ids]
        return [{"id": e["id"], "turns": len(e["question"]),
                 "classes": list(e["involved_classes"]), "questions": user_texts(e)}
                for e in chosen]
    if op == "reset":
        cat = _category(req.get("category"))
        e = entry(cat, req.get("id"))
        if _session is not None:
            _session.close()
            _session = None
        _session = Session(cat, e, req.get("docs", "full"))
        return {"id": e["id"], "turns": len(_session.questions), "tools": _session.tools(),
                "observation": _session.questions[0]}
    if op == "tools":
        return _need_session().tools()
    if op == "call":
        return _need_session().call(req.get("name"), req.get("arguments"))
    if op == "end_turn":
        return _need_session().end_turn()
    if op == "check":
        return _need_session().check()
    if op == "ground_truth":
        cat = _category(req.get("category"))
        e = entry(cat, req.get("id"))
        probe = Session(cat, e, "full")  # for the methods' parameter names only
        try:
            return [[parse_reference_call(c, probe) for c in turn]
                    for turn in _truth[cat][e["id"]]]
        finally:
            probe.close()
    raise RequestError(f"unknown op {op!r}")


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a backend prints must not corrupt the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise RequestError("a request must be a JSON object")
            reply: dict[str, Any] = {"result": handle(req)}
        except RequestError as exc:
            reply = {"error": str(exc)}
        except Exception as exc:  # reported to the caller; the worker lives on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply, ensure_ascii=False, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
