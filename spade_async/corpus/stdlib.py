"""The default corpus source: docstrings of this interpreter's standard library.

This module must never import a standard-library module for its docstrings in the daemon's own
process (`antigravity` opens a browser, `this` prints, `tkinter` wants a display): `StdlibDocs`
does that in a throwaway child (`worker.py`, run by path), restarted after a crash or a hang.
"""

from __future__ import annotations

import fnmatch
import json
import os
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from spade_async.core.logs import get_logger
from spade_async.corpus.documents import CorpusSource, Document

log = get_logger("corpus")


# fnmatch patterns over dotted module names ('*' also matches dots). Denied for side effects
# at import (a browser, printing, a display, a REPL hook), for test suites (slow, they mutate
# global state), for `__main__` modules (they run a program), and for codec tables (hundreds
# of imports whose docstrings are a line each).
DEFAULT_STDLIB_DENY: tuple[str, ...] = (
    "antigravity",
    "this",
    "__hello__",
    "__phello__*",
    "tkinter",
    "tkinter.*",
    "turtle",
    "turtledemo*",
    "idlelib*",
    "readline",
    "test",
    "test.*",
    "*.test",
    "*.test.*",
    "*.tests",
    "*.tests.*",
    "*.idle_test*",
    "*.__main__",
    "encodings.*",
    "pydoc_data*",
    "lib2to3.pgen2",  # builds grammar pickles on import in some installs
)

# The child's script: a real module, run by path (`-I` keeps its directory off sys.path).
_STDLIB_WORKER = Path(__file__).resolve().with_name("worker.py")


class _ImportWorker:
    """A child interpreter that imports one module per request, restarted after a crash or a
    hang (the module that caused it is skipped, the rest of the walk goes on)."""

    def __init__(self, python: str, timeout_s: float) -> None:
        self._python = python
        self._timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._cwd = tempfile.mkdtemp(prefix="spade-stdlib-")

    def _start(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        self._buffer = b""
        self._proc = subprocess.Popen(
            [self._python, "-I", "-S", "-B", str(_STDLIB_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self._cwd,  # a module that writes into its cwd writes into a temp dir
            env=env,
            bufsize=0,
        )
        return self._proc

    def query(self, module: str) -> dict[str, Any] | None:
        """The worker's reply, or None when it crashed or ran past the deadline."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(module.encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self._kill()
            return None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if not sel.select(self._timeout_s):
                    log.warning("stdlib import timed out", module=module, timeout_s=self._timeout_s)
                    self._kill()
                    return None
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    log.warning("stdlib import worker died", module=module, rc=proc.wait())
                    self._kill()
                    return None
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc = None

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()  # EOF ends the worker's loop
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        try:
            for leftover in Path(self._cwd).iterdir():
                if leftover.is_file():
                    leftover.unlink()
            os.rmdir(self._cwd)
        except OSError:
            pass  # a module left a directory behind; it is in the system temp dir


class StdlibDocs(CorpusSource):
    """Docstrings of this interpreter's standard library: one document per module (its own
    docstring, then those of its public classes, their methods, and its functions).

    The default source: it needs no download. Modules are walked in sorted order, packages
    depth-first into their submodules; private modules (`_x`) and `deny` matches are skipped;
    modules are imported in a child interpreter, never in this process.
    """

    def __init__(
        self,
        *,
        min_doc_chars: int = 300,
        include_submodules: bool = True,
        deny: Iterable[str] = DEFAULT_STDLIB_DENY,
        import_timeout_s: float = 30.0,
        python: str | None = None,
    ) -> None:
        self.min_doc_chars = min_doc_chars
        self.include_submodules = include_submodules
        self.deny = tuple(deny)
        self.import_timeout_s = import_timeout_s
        self.python = python or sys.executable
        v = sys.version_info
        # The docs change with the interpreter's version, so the name does too.
        self._name = f"stdlib:py{v.major}.{v.minor}" + ("" if include_submodules else ":top")

    @property
    def name(self) -> str:
        return self._name

    def is_denied(self, module: str) -> bool:
        if any(p.startswith("_") and p != "__future__" for p in module.split(".")):
            return True  # private modules repeat their public face (`_pydecimal`, `_pyio`)
        return any(fnmatch.fnmatchcase(module, pattern) for pattern in self.deny)

    def iter_documents(self) -> Iterator[Document]:
        worker = _ImportWorker(self.python, self.import_timeout_s)
        stack = sorted(sys.stdlib_module_names, reverse=True)  # pop() takes the smallest
        skipped = 0
        try:
            while stack:
                module = stack.pop()
                if self.is_denied(module):
                    continue
                reply = worker.query(module)
                if reply is None or not reply["ok"]:
                    skipped += 1
                    if reply is not None:
                        log.debug("stdlib module skipped", module=module, error=reply["error"])
                    continue
                if self.include_submodules:
                    stack.extend(sorted(reply["children"], reverse=True))
                text = reply["text"]
                if len(text) >= self.min_doc_chars:
                    yield Document(id=f"stdlib:{module}", source=self.name, title=module, text=text)
        finally:
            worker.close()
            log.debug("stdlib walk ended", skipped=skipped)
