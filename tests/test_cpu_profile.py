"""The serving dtype and thread settings chosen from the CPU's features (fake /proc/cpuinfo flag
sets of both kinds of host, since CI hosts vary), the trainer's precision following them, and
`spade bench inference`'s report against the session's vLLM server."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spade_async.core.config import ConfigError, load_config
from spade_async.core.config.trainer import TrainerConfig
from spade_async.inference.cpu_profile import (
    LACKS_BF16,
    CpuInfo,
    choose_dtype,
    choose_threads,
    effective_dtype,
    parse_cpuinfo,
    read_cpu,
    vllm_device,
)
from trainer.model import resolve_precision, save_full_weights

REPO = Path(__file__).resolve().parents[1]

# The first processor of each; real lines, shortened.
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2 sha_ni
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 avx512_bf16
"""
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
COOPER_LAKE = """model name\t: Intel(R) Xeon(R) Gold 6348H
flags\t\t: fpu avx avx2 avx512f avx512_bf16
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm sve
CPU implementer\t: 0x41
"""


def cpu(text: str, cores: int = 2) -> CpuInfo:
    return parse_cpuinfo(text, tuple(range(cores)))


def test_an_avx2_only_host_serves_float32_and_says_why():
    host = cpu(EPYC_AVX2)
    assert host.model == "AMD EPYC 7B13"  # the first processor's line, not the second's flags
    assert host.reported_flags() == {"avx2": True, "avx512f": False, "avx512_bf16": False,
                                     "amx_bf16": False, "amx_tile": False}
    choice = choose_dtype("auto", cpu=host)
    assert choice.dtype == "float32" and choice.reason == LACKS_BF16
    assert "emulated" in choice.reason and "float32" in choice.reason


@pytest.mark.parametrize(("text", "flag"), [(SAPPHIRE_RAPIDS, "amx_bf16"),
                                            (COOPER_LAKE, "avx512_bf16"), (GRAVITON3, "bf16")])
def test_a_host_with_native_bf16_serves_bfloat16(text, flag):
    choice = choose_dtype("auto", cpu=cpu(text))
    assert choice.dtype == "bfloat16"
    assert choice.reason == f"CPU has {flag}: native bf16"


def test_a_dtype_set_in_the_config_is_honoured_on_either_host():
    amx, avx2 = cpu(SAPPHIRE_RAPIDS), cpu(EPYC_AVX2)
    assert choose_dtype("float32", cpu=amx).dtype == "float32"
    forced = choose_dtype("bfloat16", cpu=avx2)
    assert forced.dtype == "bfloat16" and "model.dtype = bfloat16" in forced.reason
    assert "emulates bf16" in forced.reason  # honoured, with a warning in the reason
    assert "emulates" not in choose_dtype("bfloat16", cpu=amx).reason


def test_a_gpu_build_keeps_vllm_auto_and_unknown_flags_are_safe():
    assert choose_dtype("auto", device="gpu", cpu=cpu(EPYC_AVX2)).dtype == "auto"
    assert choose_dtype("float32", device="gpu", cpu=cpu(EPYC_AVX2)).dtype == "float32"
    unknown = read_cpu(Path("/nonexistent/cpuinfo"))  # what a host without /proc gives
    assert unknown.flags is None and unknown.model == "unknown" and unknown.cores
    assert set(unknown.reported_flags().values()) == {None}
    assert choose_dtype("auto", cpu=unknown).dtype == "float32"
    # vLLM's auto: the checkpoint's dtype, a float32 one cast down to bf16
    gpu = choose_dtype("auto", device="gpu")
    assert effective_dtype(gpu, "bfloat16") == effective_dtype(gpu, "float32") == "bfloat16"
    assert effective_dtype(gpu, "float16") == "float16"
    assert effective_dtype(choose_dtype("float32"), "bfloat16") == "float32"


def test_this_host_is_read():
    host = read_cpu()
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo")
    assert host.flags and host.model != "unknown" and host.cores


def test_threads_take_every_core_of_a_small_host_the_server_has_to_itself_only():
    small = choose_threads(cpu(EPYC_AVX2, cores=2), exclusive=True)
    assert small.env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"} and "2 cores" in small.reason
    assert choose_threads(parse_cpuinfo(EPYC_AVX2, (2, 5, 7)), exclusive=True).env == {
        "VLLM_CPU_OMP_THREADS_BIND": "2,5,7"}  # the affinity mask, not 0..n-1
    # The embedded stack shares the cores with the trainer: vLLM's own binding.
    shared = choose_threads(cpu(EPYC_AVX2, cores=2))
    assert shared.env == {} and "shared with the trainer" in shared.reason
    big = choose_threads(cpu(SAPPHIRE_RAPIDS, cores=32), exclusive=True)
    assert big.env == {} and "vLLM's own binding" in big.reason


def _fake_python(path: Path, answer: str) -> Path:
    path.write_text(f"#!/bin/sh\necho {answer}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_which_vllm_build_an_interpreter_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("SPADE_VLLM_DEVICE", raising=False)
    assert vllm_device(_fake_python(tmp_path / "gpu-python", "gpu")) == "gpu"
    assert vllm_device(_fake_python(tmp_path / "cpu-python", "cpu")) == "cpu"
    assert vllm_device(tmp_path / "missing-python") == "cpu"
    assert vllm_device(sys.executable) == "cpu"  # no vLLM at all: the embedded default
    vllm_cpu = REPO / ".venv-vllm" / "bin" / "python"
    if vllm_cpu.exists():
        assert vllm_device(vllm_cpu) == "cpu"  # the vllm-cpu package
    monkeypatch.setenv("SPADE_VLLM_DEVICE", "gpu")
    assert vllm_device(tmp_path / "missing-python") == "gpu"


def test_model_dtype_is_a_config_field(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\ndtype = "float32"\n')
    assert load_config(f, environ={}).model.dtype == "float32"
    assert load_config(f, environ={"SPADE__MODEL__DTYPE": "auto"}).model.dtype == "auto"
    f.write_text('[model]\ndtype = "float16"\n')
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(f, environ={})


def _shell(tmp_path, *args: str, **env: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "spade_async.cli", "config", "--config",
                          str(REPO / "configs" / "embedded.toml"), "--shell", *args],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", **env}).stdout
    # the shell reads it as the script does
    script = out + '\nprintf "%s\\n%s\\n%s\\n%s\\n%s\\n%s\\n" "$cfg_device" "$cfg_dtype" ' \
        '"$cfg_dtype_reason" "$cfg_lora" "$cfg_lora_targets" "$cfg_enforce_eager"'
    device, dtype, reason, lora, targets, eager = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    return {"device": device, "dtype": dtype, "reason": reason, "lora": lora,
            "lora_targets": targets, "eager": eager}


def test_config_shell_names_the_dtype_and_why(tmp_path):
    here = choose_dtype("auto")
    got = _shell(tmp_path)
    # the embedded default reloads merged weights: no adapters served, no --enable-lora
    assert got == {"device": "cpu", "dtype": here.dtype, "reason": here.reason, "lora": "0",
                   "lora_targets": "q_proj k_proj v_proj o_proj",  # trainer.lora_targets
                   "eager": "0"}  # a long run: torch.compile's start-up buys faster decode
    forced = _shell(tmp_path, SPADE__MODEL__DTYPE="float32")
    assert forced["dtype"] == "float32" and forced["reason"] == "model.dtype = float32 in the config"
    gpu = _shell(tmp_path, "--vllm-python", str(_fake_python(tmp_path / "py", "gpu")))
    assert gpu["device"] == "gpu" and gpu["dtype"] == "auto"
    lora = _shell(tmp_path, SPADE__ENDPOINTS__0__WEIGHT_SWAP__TYPE="vllm-lora")
    assert lora["lora"] == "1"  # adapters served: --enable-lora on trainer.lora_targets
    assert _shell(tmp_path, SPADE__MODEL__ENFORCE_EAGER="true")["eager"] == "1"


# ---- the trainer follows ------------------------------------------------------------------------

def _checkpoint(tmp_path: Path, dtype: str) -> Path:
    d = tmp_path / f"ckpt-{dtype}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"dtype": dtype, "tie_word_embeddings": True}))
    (d / "tokenizer.json").write_text("{}")
    return d


def test_trainer_autocast_follows_the_serving_dtype(tmp_path):
    bf16_ckpt = _checkpoint(tmp_path, "bfloat16")
    amx, avx2 = cpu(SAPPHIRE_RAPIDS), cpu(EPYC_AVX2)
    on_amx = resolve_precision("auto", "auto", "cpu", bf16_ckpt, cpu=amx)
    assert on_amx.autocast_bf16 and on_amx.serving_dtype == torch.bfloat16
    assert "amx_bf16" in on_amx.reason
    on_avx2 = resolve_precision("auto", "auto", "cpu", bf16_ckpt, cpu=avx2)
    assert not on_avx2.autocast_bf16 and on_avx2.serving_dtype == torch.float32
    assert LACKS_BF16 in on_avx2.reason
    assert on_avx2.as_dict() == {"autocast_bf16": False, "serving_dtype": "float32",
                                 "reason": on_avx2.reason}
    # model.dtype forced: the trainer follows the servers, whatever the CPU
    assert not resolve_precision("auto", "float32", "cpu", bf16_ckpt, cpu=amx).autocast_bf16
    assert resolve_precision("auto", "bfloat16", "cpu", bf16_ckpt, cpu=avx2).autocast_bf16
    # an explicit trainer.autocast_bf16 is honoured; exports still use the serving dtype
    pinned = resolve_precision(False, "auto", "cpu", bf16_ckpt, cpu=amx)
    assert not pinned.autocast_bf16 and pinned.serving_dtype == torch.bfloat16
    assert "autocast_bf16 = false" in pinned.reason
    assert resolve_precision(True, "auto", "cpu", bf16_ckpt, cpu=avx2).autocast_bf16
    # a GPU trainer: vLLM's auto of the checkpoint, float32 cast down to bf16
    fp32_ckpt = _checkpoint(tmp_path, "float32")
    for ckpt in (bf16_ckpt, fp32_ckpt):
        gpu = resolve_precision("auto", "auto", "cuda", ckpt, cpu=avx2)
        assert gpu.autocast_bf16 and gpu.serving_dtype == torch.bfloat16


def test_trainer_config_autocast_is_auto_true_or_false():
    assert TrainerConfig().autocast_bf16 == "auto"
    assert TrainerConfig(autocast_bf16=True).autocast_bf16 is True
    assert TrainerConfig(autocast_bf16="false").autocast_bf16 is False
    with pytest.raises(ValueError):
        TrainerConfig(autocast_bf16="maybe")


def test_full_weight_exports_use_the_serving_dtype(tmp_path):
    from safetensors.torch import load_file

    base = _checkpoint(tmp_path, "bfloat16")
    state = {"model.norm.weight": torch.ones(4) / 3}
    save_full_weights(state, base, tmp_path / "v1", torch.float32)
    assert load_file(tmp_path / "v1" / "model.safetensors")["model.norm.weight"].dtype == \
        torch.float32
    assert json.loads((tmp_path / "v1" / "config.json").read_text())["dtype"] == "float32"
    assert (tmp_path / "v1" / "tokenizer.json").exists()
    save_full_weights(state, base, tmp_path / "v2")  # default: the checkpoint's dtype
    assert load_file(tmp_path / "v2" / "model.safetensors")["model.norm.weight"].dtype == \
        torch.bfloat16


def test_the_step_runner_computes_as_resolved(tmp_path):
    from trainer.parallel import process_group
    from trainer.step import StepRunner
    from trainer.testing import tiny_llama

    tiny = tiny_llama(tmp_path / "tiny")
    tcfg = TrainerConfig(lora_targets=["q_proj"], backend="gloo")
    with process_group("gloo", timeout_s=60) as d:
        fp32 = StepRunner(tcfg, d, tiny, model_dtype="float32")
        assert not fp32.precision.autocast_bf16 and fp32.precision.serving_dtype == torch.float32
        bf16 = StepRunner(tcfg, d, tiny, model_dtype="bfloat16")
        assert bf16.precision.autocast_bf16
        with bf16._autocast():
            assert torch.is_autocast_enabled("cpu")
        with fp32._autocast():
            assert not torch.is_autocast_enabled("cpu")


# ---- the benchmark's report ---------------------------------------------------------------------

@pytest.mark.slow
def test_bench_inference_report_against_the_session_server(vllm_server, checkpoint):
    from spade_async.bench.inference import run_inference_bench

    notes: list[str] = []
    r = run_inference_bench(checkpoint, base_url=vllm_server.base_url, streams=2, max_tokens=8,
                            swaps=1, progress=notes.append)
    here = choose_dtype("auto")
    h = r["host"]
    assert h["dtype"] == here.dtype and h["dtype_reason"] == here.reason
    assert set(h["flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert h["cores"] >= 1 and h["cpu_model"] and h["vllm_device"] == "cpu"
    assert r["decode"]["concurrent"]["streams"] == 2 and r["decode"]["concurrent"]["tokens"] == 32
    assert r["decode_adapter"]["tokens"] == 32
    assert r["lora_load_s"]["n"] == 1 and r["full_reload_s"]["n"] == 1
    assert "skipped" in r["lora_cost"]  # no second server against a given one
    hf = r["hf_generate"]
    assert hf["dtype"] == effective_dtype(here, "bfloat16") and hf["threads"] == h["cores"]
    assert hf["concurrent"] == {**hf["concurrent"], "batch": 2, "tokens": 16}
    assert hf["single"]["batch"] == 1 and hf["single"]["tokens"] == 8
    assert r["vs_hf"]["concurrent_ratio"] == pytest.approx(
        r["decode"]["concurrent"]["tokens_per_s"] / hf["concurrent"]["tokens_per_s"], rel=0.01)
    assert any(n.startswith("host: ") for n in notes)
    assert any("transformers generate: batch 2" in n for n in notes)
