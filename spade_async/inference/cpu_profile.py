"""What this host's CPU can do, and the settings a CPU vLLM server runs with because of it.

One decision, read by three places that must agree: `spade config --shell` (scripts/inference.sh
passes `--dtype` from it), the trainer (bf16 autocast, and the dtype of full-weight exports,
follow the serving dtype, so behaviour and trainer log-probs come from the same arithmetic), and
`spade bench inference` (which reports it). bf16 is fast on a CPU only where the hardware
multiplies bf16 (x86 AVX512-BF16 or AMX, aarch64 BF16); elsewhere PyTorch and vLLM emulate it
by converting to float32 around every kernel, and a measured 2-core AVX2 EPYC served
SmolLM2-135M 4.1x faster in float32 (114.8 vs 27.8 tok/s at 16 streams).

Reads /proc/cpuinfo and the affinity mask only: no torch, no vLLM, no processes started (except
`vllm_device`, which asks a given interpreter which vLLM build it has).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DtypeSetting = Literal["auto", "bfloat16", "float32"]
Device = Literal["cpu", "gpu"]

# Flags that mean the CPU computes in bf16 natively (x86 /proc/cpuinfo `flags`, aarch64
# `Features`), strongest first.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# What `spade bench inference` prints about the host.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

LACKS_BF16 = ("CPU lacks avx512_bf16/amx_bf16: bf16 would be emulated, float32 is ~4x faster")
# At or below this many usable cores, vLLM's own thread binding (one core kept back for the
# API server and the scheduler) would leave the model half or more of the machine idle.
FEW_CORES = 4


@dataclass(frozen=True)
class CpuInfo:
    model: str  # "unknown" where the OS does not say
    flags: frozenset[str] | None  # None: unknown (no /proc/cpuinfo: not Linux)
    cores: tuple[int, ...]  # the CPU ids this process may run on

    def has(self, flag: str) -> bool:
        return self.flags is not None and flag in self.flags

    def reported_flags(self) -> dict[str, bool | None]:
        return {f: (None if self.flags is None else f in self.flags) for f in REPORTED_FLAGS}


def parse_cpuinfo(text: str, cores: tuple[int, ...]) -> CpuInfo:
    """The first processor's model name and flags (`flags` on x86, `Features` on aarch64)."""
    model, flags = "unknown", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model == "unknown":
            model = value.strip() or "unknown"
        elif key in ("flags", "features") and flags is None:
            flags = frozenset(value.split())
    return CpuInfo(model, flags, cores)


def usable_cores() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return tuple(range(os.cpu_count() or 1))


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This host's CPU; flags None (and model "unknown") where /proc/cpuinfo cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return CpuInfo("unknown", None, usable_cores())
    return parse_cpuinfo(text, usable_cores())


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "bfloat16", "float32", or "auto" (vLLM's own choice: a GPU server)
    reason: str  # one line for a human: what was chosen and why


def choose_dtype(setting: DtypeSetting = "auto", *, device: Device = "cpu",
                 cpu: CpuInfo | None = None) -> DtypeChoice:
    """The dtype a vLLM server on this host serves in (`model.dtype`, resolved)."""
    cpu = cpu if cpu is not None else read_cpu()
    native = next((f for f in NATIVE_BF16_FLAGS if cpu.has(f)), None)
    if setting != "auto":
        note = ""
        if device == "cpu" and setting == "bfloat16" and native is None:
            note = " (this CPU emulates bf16: expect it slower than float32)"
        return DtypeChoice(setting, f"model.dtype = {setting} in the config{note}")
    if device == "gpu":
        return DtypeChoice("auto", "GPU build of vLLM: its own auto (the checkpoint dtype, "
                           "float32 cast down to bf16)")
    if cpu.flags is None:
        return DtypeChoice("float32", "CPU flags unknown (no /proc/cpuinfo): float32, which "
                           "no CPU emulates")
    if native is not None:
        return DtypeChoice("bfloat16", f"CPU has {native}: native bf16")
    return DtypeChoice("float32", LACKS_BF16)


def effective_dtype(choice: DtypeChoice, checkpoint_dtype: str) -> str:
    """The dtype the server really computes in: `choice.dtype`, or for vLLM's auto what vLLM
    makes of the checkpoint's (float32 is cast down to bf16 on a GPU that has it)."""
    if choice.dtype != "auto":
        return choice.dtype
    return "bfloat16" if checkpoint_dtype == "float32" else checkpoint_dtype


@dataclass(frozen=True)
class ThreadChoice:
    env: dict[str, str]  # VLLM_CPU_* variables for the server (empty: vLLM's defaults)
    reason: str


def choose_threads(cpu: CpuInfo | None = None, *, exclusive: bool = False) -> ThreadChoice:
    """vLLM's CPU worker binds one OpenMP thread per physical core and keeps one core back for
    the API server and the engine's scheduler (VLLM_CPU_OMP_THREADS_BIND=auto).

    A server with a small host to itself (`exclusive`: `spade bench inference`, or
    SPADE_VLLM_EXCLUSIVE=1 for a dedicated inference host) runs faster with its model's
    threads on every core: on 2 cores, 274 instead of 201 tok/s at 16 streams. The embedded
    stack is not that: the trainer and the daemon share the cores, and OpenMP threads bound
    to a core the trainer also uses stall each other. Measured on 2 cores with a training
    step running beside 16 streams: 237 tok/s with vLLM's own binding, 177 with every core,
    and the trainer as fast either way. So vLLM's binding stays unless the host is its own."""
    cpu = cpu if cpu is not None else read_cpu()
    n = len(cpu.cores)
    if n > FEW_CORES:
        return ThreadChoice({}, f"{n} cores: vLLM's own binding (one core kept for the "
                                "API server and scheduler)")
    if not exclusive:
        return ThreadChoice({}, f"{n} cores shared with the trainer and daemon: vLLM's own "
                                "binding (SPADE_VLLM_EXCLUSIVE=1 gives the model every core "
                                "on a host of its own)")
    ids = ",".join(str(c) for c in cpu.cores)
    return ThreadChoice({"VLLM_CPU_OMP_THREADS_BIND": ids},
                        f"{n} cores, the server alone on them: the model's threads on all of "
                        f"them ({ids}); vLLM's own binding would keep one back for the "
                        "scheduler")


_BUILD_PROBE = """
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return ""
cpu = version("vllm-cpu") or version("vllm").endswith("+cpu")
print("cpu" if cpu else "gpu" if version("vllm") else "none")
"""


def vllm_device(python: str | Path) -> Device:
    """Which vLLM build `python` runs: 'gpu' for a vLLM that is not the vllm-cpu package (nor a
    source build whose version ends in +cpu), else 'cpu' (also when `python` has no vLLM or
    cannot be asked: the embedded default). SPADE_VLLM_DEVICE=cpu|gpu answers without asking."""
    forced = os.environ.get("SPADE_VLLM_DEVICE", "").strip().lower()
    if forced in ("cpu", "gpu"):
        return forced  # type: ignore[return-value]
    try:
        out = subprocess.run([str(python), "-c", _BUILD_PROBE], capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return "gpu" if out == "gpu" else "cpu"
