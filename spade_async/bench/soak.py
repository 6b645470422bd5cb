"""`spade bench soak`: the whole stack for a long time against a fast fake endpoint, and whether
what it holds levels off.

Three processes, as the Procfile runs them: the daemon (`spade run`: real sandbox, LanceDB
memory, spool, rolled run records) and the trainer (`python -m trainer`: a LoRA on a tiny random
Llama with SmolLM2's vocabulary, publishing every step into the fake, checkpointing every 10 steps)
against the fake endpoint in its own process (spade_async.testing.soak: ~0 latency, a stationary
stream of designs and turns). Retention is set small (segments of `segment_mb`, `keep_mb` per
file), and so are the memory's capacities (500 accepted, 500 rejected) and its version window
(60 s), so the rolls, the pruning and the retirements happen inside the soak.

Every `sample_s` the harness records disk bytes by directory of the data dir (allocated
blocks), the RSS of each process (the daemon's sandbox workers summed apart), the bytes each
process wrote to storage (/proc/PID/io), and from the daemon's status.json its counters, the
recent memory-operation latencies (p50/p99) and status-tick times. The verdicts:
- level-off: each series' growth over the last quarter of the run as a share of its level
  there, from a least-squares fit over the last half (`level_off`) (the bar: under 5%);
- drift: memory-op p99 and status-tick time (the CPU time of the tick's thread; its wall
  time, which also counts the waits for the GIL behind a busy event loop, is shown beside it)
  at the end (median over the last tenth of the run) over the first hour's (median over the first hour, or the first quarter of a shorter run)
  (the bar: within 2x);
- a week: the disk growth of the last half per episode, design and trainer step, times the
  embedded default's measured rates (README: a 60-minute run made 486 episodes and 108 designs;
  the fastest trainer arm 180 steps an hour), and the same for the bytes written.
Results: <data_dir>/bench/soak/<name>/soak.json (the series included) and the run's data dir
beside it (removed unless `keep`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The embedded default's measured rates (README, "Measured here" and the trainer sweep): what the
# soak's bytes per unit are multiplied by to say what a week of the embedded default writes.
EMBEDDED_PER_HOUR = {"episodes": 486, "designs": 108, "steps": 180}
# which unit each top-level directory of the data dir grows with
DIR_UNIT = {"run": "episodes", "spool": "episodes", "memory": "designs", "trainer": "steps",
            "weights": "steps"}
DEFAULT_CAPACITY = 40_000  # memory.max_accepted + memory.max_rejected at their defaults
LEVEL_OFF_PCT = 5.0
DRIFT_MAX = 2.0


def _corpus(path: Path, n: int) -> None:
    words = ("river stone market winter signal garden ledger copper lantern meadow harbor "
             "orbit quartz timber willow").split()
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(80))
            f.write(json.dumps({"id": f"doc{i}", "text": f"Document {i}. {text}"}) + "\n")


def soak_toml(root: Path, base_url: str, tokenizer: Path, *, segment_mb: float,
              keep_mb: float, concurrency: int = 16) -> str:
    """The soak's config: the embedded default's loop shape (writes, replays, learnability,
    checkpoint every 10 steps, publish every step) at test sizes, small retention."""
    return f"""
[paths]
data_dir = "{root / 'data'}"
models_dir = "{root / 'models'}"
[model]
checkpoint_name = "tiny"
tokenizer = "{tokenizer}"
[[endpoints]]
name = "fake"
base_url = "{base_url}"
max_concurrency = {concurrency}
request_timeout_s = 60
[endpoints.weight_swap]
type = "vllm-lora"
max_loaded_adapters = 2
[pool]
wait_for_endpoint_s = 60
[sandbox]
slots = 24
warm_workers = 4
[validation]
reader = false
[retention]
segment_mb = {segment_mb}
keep_mb = {keep_mb}
[regret]
signal = "learnability"
[rollout]
k_unhinted = 4
k_hinted = 2
max_tokens_per_turn = 16
[daemon]
designs_per_document = 4
designer_max_tokens = 256
examples_k = 1
replay_probability = 0.25
status_interval_s = 1.0
max_batches_ahead = 8
max_staleness = 12
drain_timeout_s = 5
[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{root / 'docs.jsonl'}"
id_field = "id"
[memory]
embedding_model = "hash-384"
optimize_every_s = 60
keep_versions_s = 60             # the soak's clock runs ~140x the embedded default's
                                 # (episodes an hour): its 600 s of versions are ~4 s here
max_accepted = 500               # the capacities (default 20k each) scaled to the soak, so
max_rejected = 500               # that they bite within minutes: the memory's rows level off
retire_grace_s = 10
[trainer]
mode = "lora"
lora_rank = 4
lr = 1e-4
samples_per_step = 4            # small steps: the publishes and checkpoints of many versions
step_wait_s = 2.0
micro_batch_tokens = 1024        # packed rows attend T x T: short rows are the fast ones
publish_every_steps = 1
checkpoint_every_steps = 10
kl_base_every_steps = 0        # the base model's second forward: the tiny model's time is its
                               # 49k-row output layer, and a soak measures bytes, not the KL
max_staleness = 12
publish_retry_s = 1.0
"""


# -- what one sample reads ------------------------------------------------------------------

def dir_bytes(path: Path) -> int:
    """Allocated bytes of every file under `path` (what the disk holds, not apparent sizes)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:  # rolled or pruned while we walked
                pass
    return total


def disk_by_dir(data: Path) -> dict[str, int]:
    """Bytes per top-level entry of the data dir (files at the top count as "other")."""
    out: dict[str, int] = {}
    if not data.is_dir():
        return out
    for entry in os.scandir(data):
        try:
            if entry.is_dir(follow_symlinks=False):
                out[entry.name] = dir_bytes(Path(entry.path))
            else:
                out["other"] = out.get("other", 0) + entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            pass
    return out


def _proc_field(pid: int, name: str, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    kb = _proc_field(pid, "status", "VmRSS")
    return None if kb is None else kb * 1024


def written_bytes(pid: int) -> int | None:
    """Bytes the process caused to be written to storage (/proc/PID/io write_bytes)."""
    return _proc_field(pid, "io", "write_bytes")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (the daemon's sandbox workers, bwrap included)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _status(data: Path) -> dict[str, Any]:
    try:
        return json.loads((data / "run" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _version(data: Path) -> int:
    try:
        return int(json.loads((data / "weights" / "current.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def take_sample(t0: float, data: Path, procs: dict[str, subprocess.Popen]) -> dict[str, Any]:
    st = _status(data)
    counters = st.get("counters", {})
    rss: dict[str, int | None] = {name: rss_bytes(p.pid) for name, p in procs.items()}
    kids = descendants(procs["daemon"].pid)
    rss["daemon_workers"] = sum(rss_bytes(k) or 0 for k in kids)
    disk = disk_by_dir(data)
    mem, tick = st.get("memory_ops") or {}, st.get("status_tick") or {}
    wall = st.get("status_tick_wall") or {}
    return {
        "t": round(time.monotonic() - t0, 1),
        "episodes": counters.get("episodes", 0), "designs": counters.get("designs", 0),
        "designs_accepted": counters.get("designs_accepted", 0),
        "batches": counters.get("batches", 0), "steps": _version(data),
        "disk": disk, "disk_total": sum(disk.values()),
        "rss": rss, "workers": len(kids),
        "written": {name: written_bytes(p.pid) for name, p in procs.items()},
        "memory_p50_ms": mem.get("p50_ms"), "memory_p99_ms": mem.get("p99_ms"),
        "memory_ops": mem.get("count"), "memory_cache_mb": st.get("memory_cache_mb"),
        "tick_p50_ms": tick.get("p50_ms"), "tick_p99_ms": tick.get("p99_ms"),
        "tick_wall_p50_ms": wall.get("p50_ms"), "tick_wall_p99_ms": wall.get("p99_ms"),
    }


# -- verdicts -------------------------------------------------------------------------------

def level_off(ts: list[float], vs: list[float]) -> dict[str, Any]:
    """Growth over the last quarter of the run as a share of the final level: the least-squares
    slope over the last half of the run times a quarter of its duration, over the mean of its
    last quarter. A fit, not two points: what compaction, pruning and rolling leave is a saw
    (the memory's versions pile up for a minute, then go), whose two ends say nothing about
    the trend. `end_to_end_pct` is the two-point figure (end minus 3/4), kept beside it."""
    if len(vs) < 4 or not vs[-1]:
        return {"final": vs[-1] if vs else None, "growth_last_quarter_pct": None, "ok": None}
    span = ts[-1] - ts[0]
    t_q3 = ts[0] + 0.75 * span
    at_q3 = next(v for t, v in zip(ts, vs, strict=True) if t >= t_q3)
    half = [(t, v) for t, v in zip(ts, vs, strict=True) if t >= ts[0] + 0.5 * span]
    if len(half) < 3:
        half = list(zip(ts, vs, strict=True))[-3:]
    mt = statistics.fmean(t for t, _ in half)
    mv = statistics.fmean(v for _, v in half)
    var = sum((t - mt) ** 2 for t, _ in half)
    slope = sum((t - mt) * (v - mv) for t, v in half) / var if var else 0.0
    level = statistics.fmean(v for t, v in zip(ts, vs, strict=True) if t >= t_q3)
    pct = 100.0 * slope * span / 4 / level if level else 0.0
    return {"final": vs[-1], "at_three_quarters": at_q3,
            "growth_last_quarter_pct": round(pct, 2),
            "end_to_end_pct": round(100.0 * (vs[-1] - at_q3) / vs[-1], 2),
            "ok": pct < LEVEL_OFF_PCT}


def drift(ts: list[float], vs: list[float | None]) -> dict[str, Any]:
    """The median over the last tenth of the run (at least its last 3 samples) over the median
    of its first hour (of its first quarter, if that is shorter)."""
    pts = [(t, v) for t, v in zip(ts, vs, strict=True) if v is not None]
    if len(pts) < 4:
        return {"first": None, "end": None, "ratio": None, "ok": None}
    start, end = pts[0][0], pts[-1][0]
    first_until = start + min(3600.0, (end - start) / 4)
    last_from = end - (end - start) / 10
    first = [v for t, v in pts if t <= first_until] or [pts[0][1]]
    last = [v for t, v in pts if t >= last_from]
    if len(last) < 3:
        last = [v for _, v in pts[-3:]]
    a, b = statistics.median(first), statistics.median(last)
    ratio = b / a if a > 0 else None
    return {"first": round(a, 3), "end": round(b, 3),
            "ratio": None if ratio is None else round(ratio, 2),
            "ok": None if ratio is None else ratio <= DRIFT_MAX}


def records_written(data: Path) -> dict[str, dict[str, Any]]:
    """What each rolled record file produced over the run, compressed, pruned segments
    included: its last segment's sequence number times the mean size of the segments kept
    (they roll at one uncompressed size), plus its live file. The soak's own keep_mb hides
    this from the disk; the embedded default keeps up to 1 GB of it per file."""
    out: dict[str, dict[str, Any]] = {}
    for folder in sorted(data.rglob("*.rolled")):
        segs = [p for p in folder.iterdir() if p.name[:8].isdigit()]
        if not segs:
            continue
        last = max(int(p.name[:8]) for p in segs)
        mean = sum(p.stat().st_size for p in segs) / len(segs)
        live = folder.with_name(folder.name.removesuffix(".rolled") + ".jsonl")
        if not live.exists():
            live = folder.with_name(folder.name.removesuffix(".rolled") + ".log")
        live_bytes = live.stat().st_size if live.exists() else 0
        out[str(folder.relative_to(data))] = {"segments": last,
                                              "bytes": round(last * mean) + live_bytes}
    return out


def _memory_rows(data: Path) -> int | None:
    """The rows the memory holds at the end (its `envs` table), or None if it cannot say."""
    try:
        import lancedb

        return int(lancedb.connect(str(data / "memory")).open_table("envs").count_rows())
    except Exception:  # a soak that never made a memory: the directory's growth stands
        return None


def per_week(samples: list[dict[str, Any]],
             records: dict[str, dict[str, Any]] | None = None,
             memory_rows: int | None = None) -> dict[str, Any]:
    """Disk growth over the last half of the run, per unit of work (episodes, designs, trainer
    steps, by the directory's unit), times the embedded default's rates for a week; the same
    for the bytes the daemon and trainer wrote; and, with `records` (records_written), what
    the record files produce a week before the default retention (keep_mb 1024 per file)
    caps them, in place of the run dir's growth under the soak's small keep_mb."""
    a, b = samples[len(samples) // 2], samples[-1]
    units = {u: b[u] - a[u] for u in ("episodes", "designs", "steps")}
    week = {u: r * 24 * 7 for u, r in EMBEDDED_PER_HOUR.items()}
    dirs: dict[str, Any] = {}
    total = 0.0
    for name in sorted(set(a["disk"]) | set(b["disk"])):
        unit = DIR_UNIT.get(name, "episodes")
        grew = b["disk"].get(name, 0) - a["disk"].get(name, 0)
        per = grew / units[unit] if units[unit] > 0 else 0.0
        gb = per * week[unit] / 1e9
        total += gb
        dirs[name] = {"unit": unit, "bytes_per_unit": round(per, 1), "gb_per_week": round(gb, 4)}
    written: dict[str, Any] = {}
    for name, unit in (("daemon", "episodes"), ("trainer", "steps")):
        wa, wb = a["written"].get(name), b["written"].get(name)
        if wa is None or wb is None or units[unit] <= 0:
            continue
        per = (wb - wa) / units[unit]
        written[name] = {"unit": unit, "bytes_per_unit": round(per, 1),
                         "gb_per_week": round(per * week[unit] / 1e9, 3)}
    out = {"embedded_per_hour": EMBEDDED_PER_HOUR, "units_last_half": units,
           "disk_growth": dirs, "disk_growth_gb_per_week": round(total, 4),
           "disk_ok": total < 1.0, "written": written}
    ran = {u: b[u] for u in ("episodes", "designs", "steps")}
    rec: dict[str, Any] = {}
    for name, r in (records or {}).items():
        unit = "steps" if name.startswith("trainer") else "episodes"
        per = r["bytes"] / ran[unit] if ran[unit] > 0 else 0.0
        rec[name] = {"unit": unit, "bytes_per_unit": round(per, 1),
                     "gb_per_week": round(per * week[unit] / 1e9, 4)}
    produced = sum(r["gb_per_week"] for r in rec.values())
    # the embedded default: the records as produced (not yet at keep_mb), the rest as grown;
    # with nothing rolled, the run dir's growth is all the records produced
    # the memory: the soak's capacities cap it within minutes, the embedded default's (20k
    # accepted + 20k rejected) not within a week, so it counts as every design's row at the
    # bytes a row takes here (its share of the version window included), up to the capacity
    others = {n: max(0.0, d["gb_per_week"]) for n, d in dirs.items() if n != "run"}
    if memory_rows:
        per_row = b["disk"].get("memory", 0) / memory_rows
        rows = min(week["designs"], DEFAULT_CAPACITY)
        out["memory_per_row"] = {"rows": memory_rows, "bytes_per_row": round(per_row, 1),
                                 "rows_a_week": rows,
                                 "gb_per_week": round(per_row * rows / 1e9, 4)}
        others["memory"] = out["memory_per_row"]["gb_per_week"]
    default = (produced + sum(others.values())) if rec else total
    out.update(records=rec, records_gb_per_week=round(produced, 4),
               embedded_default_gb_per_week=round(default, 4),
               embedded_default_ok=default < 1.0)
    return out


def verdicts(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ts = [s["t"] for s in samples]
    disk = {"total": level_off(ts, [s["disk_total"] for s in samples])}
    for name in sorted({k for s in samples for k in s["disk"]}):
        disk[name] = level_off(ts, [s["disk"].get(name, 0) for s in samples])
    rss = {name: level_off(ts, [s["rss"].get(name) or 0 for s in samples])
           for name in samples[-1]["rss"]}
    lat = {"memory_p50_ms": drift(ts, [s["memory_p50_ms"] for s in samples]),
           "memory_p99_ms": drift(ts, [s["memory_p99_ms"] for s in samples]),
           "tick_p50_ms": drift(ts, [s["tick_p50_ms"] for s in samples]),
           "tick_p99_ms": drift(ts, [s["tick_p99_ms"] for s in samples]),
           # shown, not judged: it also counts the GIL waits behind the daemon's event loop,
           # which grow with how busy the daemon is, not with what the status holds
           "tick_wall_p50_ms": drift(ts, [s.get("tick_wall_p50_ms") for s in samples])}
    checked = [disk["total"]["ok"], *(rss[n]["ok"] for n in ("daemon", "trainer") if n in rss),
               lat["memory_p99_ms"]["ok"], lat["tick_p50_ms"]["ok"]]
    return {"disk": disk, "rss": rss, "latency": lat,
            "all_ok": all(c is True for c in checked)}


# -- the run --------------------------------------------------------------------------------

def _stop(procs: dict[str, subprocess.Popen], names: tuple[str, ...], wait_s: float) -> None:
    for name in names:
        if procs[name].poll() is None:
            procs[name].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for name in names:
        try:
            procs[name].wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            procs[name].kill()
            procs[name].wait()


def run_soak(tokenizer: Path, out: Path, *, episodes: int = 200_000, designs: int = 50_000,
             steps: int = 2_000, minutes: float = 0.0, sample_s: float = 30.0,
             segment_mb: float = 0.25, keep_mb: float = 1.0, documents: int = 2000,
             concurrency: int = 16, keep: bool = False,
             progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Until `episodes`, `designs` and `steps` are all reached, or `minutes` (0: no cap)
    have passed; the results in out/soak.json. `concurrency`: the fake's max_concurrency (the
    daemon sizes the work in flight to it: a small one starts playing sooner)."""
    from spade_async.inference.launch import free_port, wait_healthy
    from trainer.testing import tiny_llama

    shutil.rmtree(out, ignore_errors=True)
    (out / "models").mkdir(parents=True)
    logs = out / "logs"
    logs.mkdir()
    vocab = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    tiny_llama(out / "models" / "tiny", vocab=max(vocab, 49152))
    _corpus(out / "docs.jsonl", documents)
    port = free_port()
    cfg = out / "soak.toml"
    cfg.write_text(soak_toml(out, f"http://127.0.0.1:{port}", tokenizer, segment_mb=segment_mb,
                             keep_mb=keep_mb, concurrency=concurrency))
    data = out / "data"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env = {k: v for k, v in env.items() if not k.startswith("SPADE__")}  # the soak's own config
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, argv: list[str]) -> None:
        with open(logs / f"{name}.log", "ab") as log:
            procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)

    samples: list[dict[str, Any]] = []
    try:
        start("fake", [sys.executable, "-m", "spade_async.testing.soak", str(port),
                       str(tokenizer)])
        wait_healthy(f"http://127.0.0.1:{port}", procs["fake"], 60, what="the fake endpoint")
        start("daemon", [sys.executable, "-m", "spade_async.cli", "--log-level", "warning",
                         "run", "--config", str(cfg)])
        start("trainer", [sys.executable, "-m", "trainer", "--config", str(cfg)])
        t0 = time.monotonic()
        progress(f"soak in {out}: until {episodes} episodes, {designs} designs and {steps} "
                 f"steps" + (f", or {minutes:g} minutes" if minutes else ""))
        next_at = t0
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the {name} exited ({p.returncode}) during the soak:"
                                       f"\n{tail}")
            next_at += sample_s
            time.sleep(max(0.0, next_at - time.monotonic()))
            s = take_sample(t0, data, procs)
            samples.append(s)
            progress(_line(s))
            done = (s["episodes"] >= episodes and s["designs"] >= designs
                    and s["steps"] >= steps)
            if done or (minutes and s["t"] >= 60 * minutes):
                break
    finally:
        if "daemon" in procs or "trainer" in procs:
            _stop(procs, tuple(n for n in ("daemon", "trainer") if n in procs), 60)
        if "fake" in procs:
            _stop(procs, ("fake",), 10)
    last = samples[-1]
    seconds = last["t"]
    result = {
        "config": str(cfg), "seconds": seconds, "samples": len(samples), "sample_s": sample_s,
        "targets": {"episodes": episodes, "designs": designs, "steps": steps,
                    "minutes": minutes},
        "reached": {u: last[u] for u in ("episodes", "designs", "designs_accepted", "steps",
                                         "batches")},
        "rates_per_hour": {u: round(3600 * last[u] / seconds) for u in
                           ("episodes", "designs", "steps")} if seconds else {},
        "retention": {"segment_mb": segment_mb, "keep_mb": keep_mb},
        "rolled": sorted(p.name for p in (data / "run").glob("*.rolled")),
        "verdicts": verdicts(samples),
        "week": per_week(samples, records_written(data), _memory_rows(data)),
        "series": samples,
    }
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    if not keep:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(out / "models", ignore_errors=True)
    return result


def _line(s: dict[str, Any]) -> str:
    mb = 1 << 20
    rss = " / ".join(f"{n} {(v or 0) / mb:.0f}" for n, v in s["rss"].items())
    return (f"{s['t'] / 60:6.1f} min  episodes {s['episodes']}  designs {s['designs']}  "
            f"steps {s['steps']}  disk {s['disk_total'] / mb:.1f} MB  RSS MB {rss}  "
            f"memory p50/p99 {s['memory_p50_ms']}/{s['memory_p99_ms']} ms  "
            f"tick {s['tick_p50_ms']} ms")


def render(r: dict[str, Any]) -> str:
    """The verdicts side by side."""
    v, w, mb = r["verdicts"], r["week"], 1 << 20

    def lo(name: str, x: dict[str, Any], scale: float = mb, unit: str = "MB") -> str:
        g = x["growth_last_quarter_pct"]
        mark = "-" if x["ok"] is None else ("ok" if x["ok"] else "GROWS")
        return (f"  {name:18s} final {(x['final'] or 0) / scale:9.1f} {unit}   last quarter "
                f"{'n/a' if g is None else f'{g:+.1f}%':>8s}   {mark}")

    def dr(name: str, x: dict[str, Any]) -> str:
        mark = "-" if x["ok"] is None else ("ok" if x["ok"] else "DRIFTS")
        if name.startswith("tick_wall"):
            mark = "(wall time with the GIL waits: shown, not judged)"
        return (f"  {name:18s} first {x['first']} ms   end {x['end']} ms   ratio "
                f"{x['ratio']}   {mark}")

    reached = r["reached"]
    lines = [f"soak: {r['seconds'] / 60:.1f} min, {reached['episodes']} episodes, "
             f"{reached['designs']} designs ({reached['designs_accepted']} accepted), "
             f"{reached['steps']} trainer steps; per hour {r['rates_per_hour']}",
             f"disk by directory (level-off: the last quarter's fitted growth < {LEVEL_OFF_PCT:g}% of "
             "its level):"]
    lines += [lo(n, x) for n, x in v["disk"].items()]
    lines.append("RSS by process:")
    lines += [lo(n, x) for n, x in v["rss"].items()]
    lines.append(f"latency (end / first hour <= {DRIFT_MAX:g}x):")
    lines += [dr(n, x) for n, x in v["latency"].items()]
    lines.append(f"a week of the embedded default ({w['embedded_per_hour']} an hour): disk "
                 f"growth {w['disk_growth_gb_per_week']:.3f} GB "
                 f"({'ok' if w['disk_ok'] else 'OVER 1 GB'}); by directory "
                 + ", ".join(f"{n} {d['gb_per_week']:.3f}" for n, d in w["disk_growth"].items()))
    if w["records"]:
        lines.append("  the record files as produced (the default keeps 1 GB of each): "
                     + ", ".join(f"{n} {d['gb_per_week']:.3f}" for n, d in w["records"].items())
                     + f" GB; the embedded default's retention: "
                     f"{w['embedded_default_gb_per_week']:.3f} GB a week "
                     f"({'ok' if w['embedded_default_ok'] else 'OVER 1 GB'})")
    else:
        lines.append(f"  nothing rolled: the embedded default's retention: "
                     f"{w['embedded_default_gb_per_week']:.3f} GB a week")
    if m := w.get("memory_per_row"):
        lines.append(f"  the memory: {m['rows']} rows at the end, {m['bytes_per_row'] / 1024:.1f} "
                     f"KB a row with its version window; the embedded default's week: "
                     f"{m['rows_a_week']} designs' rows, {m['gb_per_week']:.3f} GB (counted above)")
    if w["written"]:
        lines.append("  written to storage a week: " + ", ".join(
            f"{n} {d['gb_per_week']:.2f} GB ({d['bytes_per_unit']:.0f} B per {d['unit'][:-1]})"
            for n, d in w["written"].items()))
    lines.append(f"all acceptance checks: {'ok' if v['all_ok'] else 'NOT MET'}")
    return "\n".join(lines)
