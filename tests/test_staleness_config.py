"""The staleness check across sections: with trainer back-pressure on, neither side may drop as
stale a sample written behind `max_batches_ahead` waiting batches. Refused at load (exit 2 from
the CLI) with the keys and values named; every shipped config passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import ConfigError
from spade_async.envs.seed_checks import load_checked_config as load_config

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, daemon: str, trainer: str = "") -> Path:
    f = tmp_path / "c.toml"
    f.write_text(f'[[endpoints]]\nname = "a"\nbase_url = "http://x"\n[daemon]\n{daemon}\n'
                 f"[trainer]\n{trainer}\n")
    return f


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_shipped_configs_keep_fresh_work(name):
    cfg = load_config(ROOT / "configs" / name, environ={})
    ahead = cfg.daemon.max_batches_ahead
    assert ahead >= 1  # every shipped config runs with a trainer pacing the daemon
    assert min(cfg.daemon.max_staleness, cfg.trainer.max_staleness) >= ahead + 1


def test_daemon_staleness_below_batches_ahead_is_refused(tmp_path):
    f = _write(tmp_path, "max_batches_ahead = 4\nmax_staleness = 2", "max_staleness = 8")
    with pytest.raises(ConfigError) as exc:
        load_config(f, environ={})
    msg = str(exc.value)
    assert str(f) in msg
    assert "daemon.max_staleness (2) must be >= daemon.max_batches_ahead + 1 (5)" in msg


def test_trainer_staleness_below_batches_ahead_is_refused_with_exit_2(tmp_path):
    f = _write(tmp_path, "max_batches_ahead = 2\nmax_staleness = 3", "max_staleness = 2")
    with pytest.raises(ConfigError, match=r"trainer\.max_staleness \(2\) must be >= "
                       r"daemon\.max_batches_ahead \+ 1 \(3\)"):
        load_config(f, environ={})
    res = CliRunner().invoke(app, ["status", "--config", str(f)])
    assert res.exit_code == 2 and "trainer.max_staleness (2)" in res.output
    # an env override fixes it like any other key
    cfg = load_config(f, environ={"SPADE__TRAINER__MAX_STALENESS": "3"})
    assert cfg.trainer.max_staleness == 3


def test_without_back_pressure_any_staleness_loads(tmp_path):
    f = _write(tmp_path, "max_batches_ahead = 0\nmax_staleness = 0", "max_staleness = 0")
    assert load_config(f, environ={}).daemon.max_staleness == 0
