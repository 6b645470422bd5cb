from pathlib import Path

import pytest

from spade_async.config import ConfigError, VllmReloadSwap, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["embedded.toml", "gpu-example.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name, environ={})
    assert cfg.endpoints and cfg.endpoints[0].max_concurrency >= 1


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
