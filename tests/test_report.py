"""`spade report` on a run's real files: the daemon's designs/episodes/plays logs, a LanceDB
memory written through memory_db (hash embedder), and a trainer metrics.jsonl. Every PNG is a
real image, the HTML page holds them all, and the summary counts what the files hold. The math
behind two plots (diversity curve, rolling means) is checked against brute force."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import anyio
import numpy as np
from typer.testing import CliRunner

from memory_db.config import MemoryConfig
from memory_db.records import NewEnv
from memory_db.store import open_memory
from spade_async.cli import app
from spade_async.report.curves import diversity_curve, pca_2d, rolling_mean
from spade_async.report.figures import PLOTS

PNG = b"\x89PNG\r\n\x1a\n"


def _config(tmp: Path) -> Path:
    cfg = tmp / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp / "data"}"\n[memory]\nembedding_model = "hash-384"\n')
    return cfg


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn": ')


def _fill(tmp: Path) -> None:
    rng = random.Random(0)
    t0 = time.time() - 600
    run = tmp / "data" / "run"
    reasons = ["static.parse", "no_code", "sandbox.reset"]
    _write_jsonl(run / "designs.jsonl", [
        {"time": t0 + 10 * i, "status": "accepted" if i % 4 == 0 else "invalid",
         "reason": "" if i % 4 == 0 else reasons[i % 3], "policy_version": i // 10}
        for i in range(40)])
    _write_jsonl(run / "episodes.jsonl", [
        {"time": t0 + 5 * i, "hinted": i % 3 == 0, "score": float(rng.random() < 0.5),
         "policy_version": i // 20,
         **({"error": "step 1: boom", "error_kind": "sandbox_error"} if i in (7, 8)
            else {"error": None})} for i in range(60)])
    _write_jsonl(run / "plays.jsonl", [
        {"time": t0 + 30 * i, "env_id": f"e{i}", "replayed": i % 2 == 1,
         "regret": rng.random() * 0.6, "policy_version": i // 5,
         # plays written before hint leaks were measured have no hint_leak
         **({"hint_leak": 1.0 if i == 9 else 0.0, "leak_flagged": i == 9} if i >= 4 else {})}
        for i in range(12)])
    _write_jsonl(tmp / "data" / "trainer" / "metrics.jsonl", [
        {"event": "step", "time": t0 + 60 * i, "step": i + 1, "loss": 0.1 / (i + 1),
         "logprob_abs_diff_mean": 0.03 + 0.001 * i,
         **({"publish": {"version": i + 1, "ok": True}} if i % 2 == 0 else {})}
        for i in range(6)] + [{"event": "skipped", "time": t0 + 400, "step": 6}])

    async def memory() -> None:
        async with open_memory(MemoryConfig(embedding_model="hash-384"),
                               str(tmp / "data" / "memory")) as mem:
            results = await mem.insert_many([
                NewEnv(code=f"class Environment:\n    name = 'env{i}'\n    x = {i}\n",
                       name=f"env{i}", description=f"topic {i} " * (i + 1),
                       rejected_reason=None if i < 8 else "static.parse: bad")
                for i in range(12)])
            for r in results[:5]:
                await mem.record_episodes(r.id, hinted=[1.0, 1.0], unhinted=[0.0, rng.random()])

    anyio.run(memory)


def test_report_renders_every_plot_from_a_runs_files(tmp_path):
    cfg = _config(tmp_path)
    _fill(tmp_path)
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["designs"], s["accepted"], s["episodes"], s["envs_played"]) == (40, 10, 60, 12)
    assert s["rejected_by_reason"] == {"static.parse": 10, "no_code": 10, "sandbox.reset": 10}
    assert s["memory"] == {"stored": 12, "accepted": 8, "error": None}
    assert s["trainer_steps"] == 6 and s["versions_published"] == [1, 3, 5]
    assert s["episodes_failed"] == {"sandbox_error": 2}
    assert s["hint_leak"] == {"plays": 8, "flagged": 1, "mean": 0.125,
                              "flagged_share_by_quarter": [0.0, 0.0, 0.5, 0.0]}
    page = (out / "index.html").read_text()
    for name, title, _ in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and data.endswith(b"IEND\xaeB`\x82") and len(data) > 2_000, name
        assert f'src="{name}"' in page and title in page
    assert str(out / "index.html") in s["files"]


def test_report_of_a_run_that_has_not_started_still_renders(tmp_path):
    cfg = _config(tmp_path)
    out = tmp_path / "empty"
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "0 designs" in res.stdout
    for name, _, _ in PLOTS:
        assert (out / name).read_bytes().startswith(PNG)


def test_diversity_curve_and_rolling_mean_match_brute_force():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(7, 16))
    unit = v / np.linalg.norm(v, axis=1, keepdims=True)
    curve = diversity_curve(v)
    assert np.isnan(curve[0])
    for i in range(1, 7):
        sims = unit[: i + 1] @ unit[: i + 1].T
        n = i + 1
        brute = 1.0 - (sims.sum() - n) / (n * (n - 1))
        assert abs(curve[i] - brute) < 1e-9
    x = rng.normal(size=30)
    r = rolling_mean(x, 5)
    assert all(abs(r[i] - x[max(0, i - 4): i + 1].mean()) < 1e-12 for i in range(30))
    xy = pca_2d(v)
    assert xy.shape == (7, 2) and abs(xy[:, 0].var()) >= abs(xy[:, 1].var())


def test_episode_columns_hold_what_the_report_reads_from_each_record():
    from spade_async.report.data import Episodes

    recs = [{"time": 10.0 + i, "hinted": i % 2 == 1, "score": i / 10, "policy_version": i // 3,
             "seconds": 1.5, "sampled_tokens": 7, "prompt_len": 100 + i,
             "turns": [{"action": "x" * 100}],  # the transcript is not kept
             **({"error": "boom", "error_kind": "timeout" if i < 8 else None, "score": None}
                if i >= 6 else {"error": None})} for i in range(10)]
    eps = Episodes([{"no": "time"}, *recs])
    assert len(eps) == 10 and bool(eps) and not Episodes()
    assert eps.time.tolist() == [10.0 + i for i in range(10)]
    assert eps.hinted.tolist() == [i % 2 == 1 for i in range(10)]
    assert eps.failed.tolist() == [i >= 6 for i in range(10)]
    assert np.isnan(eps.score[6:]).all() and eps.score[3] == np.float32(0.3)
    assert eps.failures() == {"timeout": 2, "unknown": 2}
    assert eps.policy_version.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    # the cost ledger's sums, prompt tokens included
    assert eps.total("prompt_len") == sum(100 + i for i in range(10))
    assert eps.total("seconds") == 15.0 and eps.total("sampled_tokens") == 70
    assert Episodes().failures() == {} and Episodes().total("seconds") == 0.0
