"""The report's figures: each PNG's title and caption (PLOTS), its panels and size (LAYOUT),
and drawing them all into files with matplotlib's Agg backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig
from spade_async.report.curriculum import curriculum
from spade_async.report.curriculum_plots import (
    MAX_CURRICULUM_PANELS,
    plot_curriculum,
    plot_moves,
    plot_probe,
)
from spade_async.report.data import RunData
from spade_async.report.plots import (
    plot_designs,
    plot_diversity,
    plot_embedding_map,
    plot_eval,
    plot_regret,
    plot_trainer,
)
from spade_async.report.training import plot_training

PLOTS: list[tuple[str, str, str]] = [
    ("regret.png", "Regret and solve rates",
     "Top: regret (mean hinted score minus mean unhinted score) of every played environment, "
     "new and replayed, with its rolling mean. Bottom: solve rate and mean score of hinted and "
     "unhinted episodes, rolling over 20 episodes."),
    ("designs.png", "Acceptance and rejections",
     "Share of the designer's proposals accepted into the memory, and every design's outcome per "
     "time bin: accepted or the first failing check (no_code, static.parse, sandbox checks, "
     "duplicate)."),
    ("diversity.png", "Memory diversity",
     "Mean pairwise cosine distance of the accepted environments' embeddings as each was stored "
     "(grey: how many there were)."),
    ("embedding_map.png", "Embedding map",
     "Every stored environment projected on the first two principal components of its "
     "embedding; played ones coloured by their regret EMA, rejected ones as grey crosses."),
    ("trainer.png", "Trainer",
     "Loss per optimizer step and the mean absolute difference between the trainer's and the "
     "inference server's log-probs of the sampled tokens; grey lines mark published versions."),
    ("training.png", "Training drift and throughput",
     "Per optimizer step: the policy's KL to the base model and mean |log pi - log pi_base| "
     "on the scored tokens; trained and sequence tokens per second; positions computed "
     "(padding included) per real sequence token."),
    ("eval.png", "Held-out evaluation",
     "Scores per held-out suite for each evaluated policy version (`spade eval`)."),
    ("moves.png", "Designer moves",
     "Cumulative counts per move over time: designs proposed (solid), accepted (dashed) and "
     "played with a score (dotted), for writes (new modules) and edits (new knob settings of a "
     "stored environment); grey: plays of the replay sampler and of the fixed baseline."),
    ("curriculum.png", "Curriculum",
     "Per family with knobs (the most edited first): the knob values its edits chose over "
     "time, one line per knob, from the family's first played setting; markers are its plays, "
     "coloured by their unhinted solve rate. The table gives each knob's first and last value "
     "and the solve rate at the first and at the last setting."),
    ("probe.png", "Probe",
     "Unhinted solve rate on the probe set (fixed training variants, fixed seeds: `spade eval "
     "--suite probe`, sampled at the rollout's temperature, and `--suite probe-greedy`, the "
     "same tasks at temperature 0) per policy version, with its 95% Wilson interval; below, "
     "the last version minus the first, paired task by task."),
]


def _curriculum_panels(d: RunData, cfg: SpadeConfig) -> int:
    return max(1, min(MAX_CURRICULUM_PANELS,
                      len(curriculum(d.designs, d.plays, d.t0,
                                 cfg.validation.solution_score))))


# file -> (panels, or a function of the data giving them; inches per panel;
#          draw(data, axes, figure, config))
LAYOUT: dict[str, tuple[int | Callable[[RunData, SpadeConfig], int], float,
                        Callable[[RunData, list, Any, SpadeConfig], None]]] = {
    "regret.png": (2, 3.2, lambda d, ax, fig, cfg: plot_regret(d, *ax,
                                                                cfg.validation.solution_score)),
    "designs.png": (2, 3.2, lambda d, ax, fig, cfg: plot_designs(d, *ax)),
    "diversity.png": (1, 3.6, lambda d, ax, fig, cfg: plot_diversity(d, *ax)),
    "embedding_map.png": (1, 6.5, lambda d, ax, fig, cfg: plot_embedding_map(d, *ax, fig)),
    "trainer.png": (2, 3.2, lambda d, ax, fig, cfg: plot_trainer(d, *ax)),
    "training.png": (3, 2.8, lambda d, ax, fig, cfg: plot_training(d, *ax)),
    "eval.png": (1, 3.6, lambda d, ax, fig, cfg: plot_eval(d, *ax)),
    "moves.png": (1, 3.6, lambda d, ax, fig, cfg: plot_moves(d, *ax)),
    "curriculum.png": (_curriculum_panels, 2.8, lambda d, ax, fig, cfg: plot_curriculum(
        d, ax, fig, cfg.validation.solution_score)),
    "probe.png": (1, 3.6, lambda d, ax, fig, cfg: plot_probe(d, *ax)),
}


def draw_figures(cfg: SpadeConfig, d: RunData, out: Path,
                 progress: Callable[[str], None]) -> list[str]:
    """Every figure of PLOTS as a PNG file in `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for name, _, _ in PLOTS:
        progress(f"plotting {name}")
        panels, inches, draw = LAYOUT[name]
        if callable(panels):
            panels = panels(d, cfg)
        fig, axes = plt.subplots(panels, 1, figsize=(9, inches * panels), squeeze=False)
        draw(d, [a[0] for a in axes], fig, cfg)
        if not fig.get_layout_engine():  # a colorbar over several panels set its own
            fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(str(out / name))
    return files
