"""`spade bench validation`: what validation costs per environment, side by side in one run:
the pipeline without the checks of issue 31 (`before`: no observation echoes, no decoded hint
answers), with them (`rules`, the default), and with the model check of the hint too (`model`,
where an agent endpoint answers). Each environment is validated by every arm in turn, best of
`reps`, so host noise hits the arms alike."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig, ValidationConfig
from spade_async.envs.hint_reader import HintReader
from spade_async.envs.validate import validate
from spade_async.sandbox.runtime import Sandbox


def seed_files() -> list[Path]:
    from spade_async.envs import seeds

    return sorted(p for p in Path(seeds.__file__).parent.glob("*.py") if p.name != "__init__.py")


def _summary(secs: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(secs), 4), "mean_s": round(statistics.mean(secs), 4),
            "max_s": round(max(secs), 4)}


async def run_validation_bench(cfg: SpadeConfig, files: list[Path], *, reps: int,
                               reader: HintReader | None, no_reader: str,
                               progress: Any = None) -> dict[str, Any]:
    before = cfg.validation.model_copy(update={"echo_probes": False, "decoded_hints": False})
    arms: dict[str, tuple[ValidationConfig, HintReader | None]] = {
        "before": (before, None), "rules": (cfg.validation, None)}
    if reader is not None:
        arms["model"] = (cfg.validation, reader)
    per_file: dict[str, dict[str, Any]] = {}
    sb_cfg = cfg.sandbox.model_copy(update={"warm_workers": min(cfg.sandbox.warm_workers, 2)})
    async with Sandbox(sb_cfg) as sb:
        for i, f in enumerate(files, 1):
            code = f.read_text()
            row: dict[str, Any] = {}
            for arm, (vcfg, r) in arms.items():
                best = float("inf")
                for _ in range(reps):
                    t0 = time.perf_counter()
                    report = await validate(code, sb, vcfg, reader=r, no_reader=no_reader)
                    best = min(best, time.perf_counter() - t0)
                row[arm] = {"seconds": round(best, 4), "accepted": report.accepted,
                            "reason": report.reason}
                if arm == "model":
                    row[arm]["hint_reader"] = report.checks[-1].reason
            per_file[f.stem] = row
            if progress:
                progress(f"{i}/{len(files)} {f.stem}: " + ", ".join(
                    f"{a} {row[a]['seconds']:.2f} s" for a in arms))
    out: dict[str, Any] = {"files": len(files), "reps": reps, "arms": {}, "per_file": per_file,
                           "model_check": "run" if reader else f"not run: {no_reader}"}
    for arm in arms:
        secs = [row[arm]["seconds"] for row in per_file.values()]
        out["arms"][arm] = {**_summary(secs), "rejected": {
            k: row[arm]["reason"] for k, row in per_file.items() if not row[arm]["accepted"]}}
    base = out["arms"]["before"]
    for arm in arms:
        a = out["arms"][arm]
        a["median_ratio"] = round(a["median_s"] / base["median_s"], 3)
        a["mean_ratio"] = round(a["mean_s"] / base["mean_s"], 3)
    return out
