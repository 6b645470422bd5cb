"""Where `spade bench inference` leaves its result, `<data_dir>/bench/inference.json`, and what
`spade status` sets the loop's sampled tokens/s against: per endpoint, the decode rate that
bench measured on this host at N streams, through a LoRA adapter for a vllm-lora endpoint
(every request names the policy's adapter), of the base model on a server without
--enable-lora for vllm-reload and vllm-nccl. Light on purpose: status imports it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig
from spade_async.core.io import atomic_write_json


def inference_result_path(cfg: SpadeConfig) -> Path:
    return cfg.paths.data_dir / "bench" / "inference.json"


def save_inference_result(cfg: SpadeConfig, report: dict[str, Any]) -> Path:
    """The whole report, stamped with when it was measured."""
    path = inference_result_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"measured_at": time.time(), **report}, indent=1)
    return path


def read_inference_result(cfg: SpadeConfig) -> dict[str, Any] | None:
    try:
        data = json.loads(inference_result_path(cfg).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _rate(result: dict[str, Any], *keys: str) -> float | None:
    node: Any = result
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) and node > 0 else None


def _endpoint_reference(result: dict[str, Any], swap: str) -> tuple[float | None, str]:
    if swap == "vllm-lora":
        return _rate(result, "decode_adapter", "tokens_per_s"), "through a LoRA adapter"
    if swap in ("vllm-reload", "vllm-nccl"):
        plain = _rate(result, "no_lora", "decode", "concurrent", "tokens_per_s")
        if plain is not None:
            return plain, "the base model without --enable-lora"
        return (_rate(result, "decode", "concurrent", "tokens_per_s"),
                "the base model (on the --enable-lora server: bench ran with --base-url)")
    return None, f"no bench figure for a '{swap}' endpoint"


def loop_reference(cfg: SpadeConfig, result: dict[str, Any] | None) -> dict[str, Any]:
    """The decode tokens/s the loop's endpoints would give at the bench's concurrency, summed
    over the config's endpoints, or why there is none (`missing`)."""
    path = inference_result_path(cfg)
    if result is None:
        return {"missing": f"no `spade bench inference` result at {path}: run it (with this "
                f"config) to compare the loop's tokens/s with the bench"}
    total, what = 0.0, []
    for e in cfg.endpoints:
        rate, label = _endpoint_reference(result, e.weight_swap.type)
        if rate is None:
            return {"missing": f"endpoint {e.name}: {label}", "path": str(path)}
        total += rate
        what.append(label)
    if not total:
        return {"missing": "the config has no endpoint", "path": str(path)}
    streams = _rate(result, "decode", "concurrent", "streams")
    return {"tokens_per_s": round(total, 1), "endpoints": len(cfg.endpoints),
            "what": "; ".join(sorted(set(what))),
            "streams": int(streams) if streams else None,
            "measured_at": result.get("measured_at"), "path": str(path)}
