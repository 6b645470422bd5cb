from pathlib import Path

import pytest

from spade_async.core.config import ConfigError, VllmReloadSwap
from spade_async.envs.seed_checks import load_checked_config as load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name, environ={})
    assert cfg.endpoints and cfg.endpoints[0].max_concurrency >= 1


def test_shipped_configs_differ_where_documented():
    embedded = load_config(ROOT / "configs" / "embedded.toml", environ={})
    smoke = load_config(ROOT / "configs" / "smoke.toml", environ={})
    gpu = load_config(ROOT / "configs" / "gpu-node.toml", environ={})
    multi = load_config(ROOT / "configs" / "multi-node.toml", environ={})
    # smoke = embedded + a stop, smaller budgets (a step per few plays, no warm-up), its own data
    # dir, the shared checkpoint
    assert smoke.daemon.stop_after_versions == 2 and embedded.daemon.stop_after_versions == 0
    assert smoke.trainer.samples_per_step < embedded.trainer.samples_per_step
    assert smoke.trainer == embedded.trainer.model_copy(
        update={"samples_per_step": smoke.trainer.samples_per_step, "warmup_steps": 0})
    assert smoke.sandbox == embedded.sandbox
    assert embedded.endpoints[0].weight_swap.type == "vllm-reload"
    assert smoke.paths.data_dir != embedded.paths.data_dir
    assert smoke.paths.models_dir == embedded.paths.data_dir / "models"
    assert [e.weight_swap.type for e in gpu.endpoints] == ["vllm-nccl", "vllm-nccl"]
    assert gpu.trainer.mode == "full" and gpu.trainer.backend == "nccl"
    # multi-node inherits the GPU node's trainer, replaces the endpoints, moves the memory
    assert multi.trainer == gpu.trainer and len(multi.endpoints) == 4
    assert multi.memory.uri.startswith("s3://")


def test_extends_merges_tables_and_replaces_arrays(tmp_path):
    (tmp_path / "base.toml").write_text(
        '[daemon]\nexamples_k = 3\ndrain_timeout_s = 5\n'
        '[[endpoints]]\nname = "a"\nbase_url = "http://a"\n'
        '[[endpoints]]\nname = "b"\nbase_url = "http://b"\n')
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.toml"
    child.write_text('extends = "../base.toml"\n[daemon]\nexamples_k = 0\n'
                     '[[endpoints]]\nname = "c"\nbase_url = "http://c"\n')
    cfg = load_config(child, environ={})
    assert (cfg.daemon.examples_k, cfg.daemon.drain_timeout_s) == (0, 5)
    assert [e.name for e in cfg.endpoints] == ["c"]
    child.write_text('extends = "nope.toml"\n')
    with pytest.raises(ConfigError, match=r"nope\.toml: extended by .*child\.toml not found"):
        load_config(child, environ={})
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "loop.toml", environ={})


def test_env_override_indexes_arrays_of_tables(tmp_path):
    f = tmp_path / "two.toml"
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://a"\n'
                 '[[endpoints]]\nname = "b"\nbase_url = "http://b"\n')
    cfg = load_config(f, environ={"SPADE__ENDPOINTS__1__BASE_URL": "http://b:9000",
                                  "SPADE__PATHS__MODELS_DIR": "/models"})
    assert [e.base_url for e in cfg.endpoints] == ["http://a", "http://b:9000"]
    assert str(cfg.paths.models_dir) == "/models"
    with pytest.raises(ConfigError, match=r"'2' is not an index of endpoints \(it has 2"):
        load_config(f, environ={"SPADE__ENDPOINTS__2__BASE_URL": "http://x"})


def test_env_override_sets_arrays_and_tables_inline(tmp_path):
    """Clusters pass config by environment: lists and tables inline (TOML or JSON), a whole
    table of an array replaced or appended, so a manifest needs no TOML edits."""
    f = tmp_path / "one.toml"
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://a"\n')
    cfg = load_config(f, environ={
        "SPADE__DAEMON__BOOTSTRAP_FAMILIES": '["arithmetic"]',
        "SPADE__EVAL__PROBE_VARIANTS": '[{"family": "arithmetic", "params": {"digits": 1}}]',
        "SPADE__ENDPOINTS__1": '{name = "b", base_url = "http://b:8002", max_concurrency = 4}',
        "SPADE__DAEMON__MOVES": "{write = 1.0, edit = 0.0}"})
    assert cfg.daemon.bootstrap_families == ["arithmetic"]
    assert cfg.eval.probe_variants[0].params == {"digits": 1}
    assert [(e.name, e.max_concurrency) for e in cfg.endpoints][1] == ("b", 4)
    assert cfg.daemon.moves == {"write": 1.0, "edit": 0.0}
    with pytest.raises(ConfigError, match="names a whole table"):
        load_config(f, environ={"SPADE__ENDPOINTS__0": "http://x"})
    with pytest.raises(ConfigError, match="SPADE__DAEMON__BOOTSTRAP_FAMILIES: starts like"):
        load_config(f, environ={"SPADE__DAEMON__BOOTSTRAP_FAMILIES": "[arithmetic"})
    with pytest.raises(ConfigError, match="bootstrap_families"):  # not a list: named by key
        load_config(f, environ={"SPADE__DAEMON__BOOTSTRAP_FAMILIES": "arithmetic"})


def test_config_shell_gives_the_inference_script_its_settings():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "spade_async.cli", "config", "--config",
                          str(ROOT / "configs" / "gpu-node.toml"), "--shell", "--endpoint",
                          "gpu-b"], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    values = dict(line.split("=", 1) for line in out.splitlines())
    assert values["cfg_port"] == "8001" and values["cfg_host"] == "127.0.0.1"
    assert values["cfg_model_dir"] == "/var/lib/spade/models/smollm2-135m-instruct"
    assert values["cfg_max_model_len"] == "8192" and values["cfg_max_lora_rank"] == "16"


def test_unknown_key_names_key_and_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[model]\nserved_nmae = "x"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(f, environ={})
    assert "model.served_nmae" in str(exc.value) and str(f) in str(exc.value)


def test_ill_typed_key(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmax_concurrency = "lots"\n')
    with pytest.raises(ConfigError, match=r"endpoints\.0\.max_concurrency"):
        load_config(f, environ={})


def test_bad_backend_type(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[[endpoints]]\nname="a"\nbase_url="http://x"\n[endpoints.weight_swap]\ntype="carrier-pigeon"\n')
    with pytest.raises(ConfigError, match="weight_swap"):
        load_config(f, environ={})


def test_discriminated_backend_and_env_override(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text('[[endpoints]]\nname="a"\nbase_url="http://x"\n[endpoints.weight_swap]\ntype="vllm-reload"\n')
    cfg = load_config(f, environ={"SPADE__MODEL__SERVED_NAME": "policy-v3"})
    assert isinstance(cfg.endpoints[0].weight_swap, VllmReloadSwap)
    assert cfg.model.served_name == "policy-v3"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", environ={})
