"""The experiment report's decontamination check: each held-out suite's nearest training
environment by the memory's embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from memory_db.embed import HashEmbedder
from spade_async.core.config import load_config
from spade_async.experiment.decontam import arm_decontamination, nearest_training

REPO = Path(__file__).resolve().parents[1]


def test_the_nearest_training_environment_of_each_suite():
    emb = HashEmbedder(128)
    envs = [{"id": "a", "name": "sums", "status": "accepted",
             "embedding": emb.embed(["add two one-digit numbers and give the sum"])[0].tolist()},
            {"id": "b", "name": "maze", "status": "accepted",
             "embedding": emb.embed(["walk a grid maze to the goal cell"])[0].tolist()},
            {"id": "c", "name": "copy", "status": "rejected",  # never trained on
             "embedding": emb.embed(["what is 3 + 4"])[0].tolist()}]
    out = nearest_training({"math": ["what is 3 + 4", "add two one-digit numbers and give the sum"],
                            "games": ["walk a grid maze to the goal cell"]}, envs, emb.embed)
    assert out["math"]["closest"]["environment"] == "sums"
    assert out["math"]["min_distance"] < 1e-4 and out["math"]["tasks"] == 2
    assert out["math"]["environments"] == 2          # the rejected one is not training
    assert out["games"]["closest"] == {"environment": "maze", "env_id": "b",
                                       "task": "walk a grid maze to the goal cell"}
    assert 0 <= out["math"]["median_nearest_distance"] <= 1
    assert nearest_training({"x": ["y"]}, [], emb.embed) == {}


def test_an_arm_block_reads_the_suites_it_can_and_names_the_rest():
    cfg = load_config(REPO / "configs" / "embedded.toml", environ={
        "SPADE__MEMORY__EMBEDDING_MODEL": "hash-64"})
    emb = HashEmbedder(64)
    envs = [{"id": "a", "name": "sums", "status": "accepted",
             "embedding": emb.embed(["chain sum of numbers"])[0].tolist()}]
    block = arm_decontamination(cfg, ["reasoning-gym-easy", "probe", "no-such-suite"], envs)
    assert set(block["suites"]) == {"reasoning-gym-easy"}   # the probe is training on purpose
    assert "no-such-suite" in block["unavailable"]
    d = block["suites"]["reasoning-gym-easy"]
    assert d["tasks"] == 40 and d["closest"]["environment"] == "sums"
    assert np.isfinite(d["min_distance"])
