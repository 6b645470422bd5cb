"""The stdlib corpus source's import worker, run as a script in a child `python -I -S -B` (any
interpreter whose standard library is the corpus, so standard library only): module names on
fd 0, one JSON reply per module on a duplicate of fd 1 (its docstrings, public classes and
functions with their signatures and docstrings, and its submodules). The real fds 0-2 point at
/dev/null so a module that prints or reads at import cannot corrupt the protocol. A module that
crashes or hangs it costs only itself: the parent (corpus.stdlib._ImportWorker) starts another."""

import importlib
import inspect
import json
import os
import pkgutil
import warnings


def clean(doc):
    return inspect.cleandoc(doc).strip() if isinstance(doc, str) and doc.strip() else ""

def signature(obj):
    try:
        return str(inspect.signature(obj))
    except Exception:  # any error: text signatures of C functions are evaluated
        return ""

def own_module(obj, modname):
    owner = getattr(obj, "__module__", None)
    return owner == modname or owner == "_" + modname.rsplit(".", 1)[-1]

def describe_member(obj, name, modname):
    is_class = inspect.isclass(obj)
    if not (is_class or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
        return
    if not own_module(obj, modname):
        return
    doc = clean(vars(obj).get("__doc__") if is_class else obj.__doc__)
    if doc:
        head = f"class {name}" if is_class else f"{name}{signature(obj)}"
        yield f"{head}\n\n{doc}"
    if not is_class:
        return
    for attr, member in sorted(vars(obj).items()):
        if attr.startswith("_"):
            continue
        target = getattr(member, "__func__", member)
        if not (callable(target) or isinstance(member, property)):
            continue
        mdoc = clean(getattr(target, "__doc__", None))
        if mdoc and mdoc != doc:
            sig = "" if isinstance(member, property) else signature(target)
            yield f"{name}.{attr}{sig}\n\n{mdoc}"

def describe(mod, modname):
    parts = [clean(mod.__doc__)]
    exported = getattr(mod, "__all__", None)
    if not (isinstance(exported, (list, tuple)) and all(isinstance(n, str) for n in exported)):
        exported = dir(mod)
    seen = set()
    for name in sorted(set(exported)):
        if name.startswith("_"):
            continue
        try:
            obj = getattr(mod, name)
        except Exception:
            continue
        if id(obj) in seen:
            continue  # an alias (bisect.bisect is bisect.bisect_right): document it once
        seen.add(id(obj))
        try:
            parts.extend(describe_member(obj, name, modname))
        except Exception:
            continue  # one odd object does not cost the module its document
    return "\n\n".join(p for p in parts if p)

def main():
    warnings.simplefilter("ignore")
    commands = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for line in commands:
        modname = line.strip()
        reply = {"module": modname, "ok": False}
        try:
            mod = importlib.import_module(modname)
            children = []
            if hasattr(mod, "__path__"):
                children = sorted(m.name for m in pkgutil.iter_modules(mod.__path__,
                                                                       modname + "."))
            reply = {"module": modname, "ok": True, "text": describe(mod, modname),
                     "children": children}
        except BaseException as exc:
            reply["error"] = f"{type(exc).__name__}: {exc}"[:500]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
