"""The `textarena` suite: TextArena's single-player text games (textarena 0.7.4), held out from
training, each played as a multi-turn episode through our environment contract by the same
episode runner as training and the other multi-turn suites (tokens or chat path), and scored
by the game itself.

The games need nothing from the network (their boards are generated from the seed) and none is
a training family of ours (spade_async/envs/seeds: no Mastermind, number guessing or grid maze,
which TextArena also has): LightsOut (5x5), Minesweeper (5x5, 5 mines), Sudoku (very easy:
six cells to fill), each at `per_game` fixed seeds, and the Tower of Hanoi with 3 and 4 disks
(one task each: its start does not depend on the seed). Tasks go round robin over the games, so
a `limit` samples all of them.

textarena's pins clash with .venv, so it lives in `.venv-games` (`bash scripts/setup-games.sh`)
and each game runs in a worker process of its own (`games_worker.py`, JSON lines; evals/worker.py).

Scores: the game's final reward is the score (TextArena pays 1 for a win, else the share of the
puzzle done: disks placed, lights off, safe cells revealed, cells filled; clipped to [0, 1]),
a win (reward 1) passes, so a suite's mean score is the mean reward and its pass rate the win
rate. Strict hands each reply to the game as it is; lenient reads replies as TextArena's default
registrations do (its ActionFormattingWrapper: a reply without square brackets is wrapped in
them). Under greedy decoding the two games are the same game until the first reply without
brackets, so the lenient one is played only when the strict one had such a reply, and otherwise
is the strict one. Both count in the task's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spade_async.core.config import RolloutConfig
from spade_async.envs.contract import EnvMeta, ResetResult, StepResult
from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult, transcript
from spade_async.evals.worker import JsonLinesWorker, WorkerSetupError, worker_batch
from spade_async.rollout.episode import Episode
from spade_async.sandbox.errors import SandboxError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".venv-games" / "bin" / "python"
WORKER = Path(__file__).with_name("games_worker.py")
SETUP = "bash scripts/setup-games.sh"
VENV = "the game venv (.venv-games)"
LABEL = "game worker"
EVAL_SEED = 271_828  # the suite's own episode seeds (EVAL_SEED + k): nothing else uses them


@dataclass(frozen=True)
class Game:
    """A registered TextArena single-player game; `seeded`: its start depends on the seed (one
    task per seed), else it is one task."""

    env_id: str
    seeded: bool = True


GAMES: tuple[Game, ...] = (
    Game("LightsOut-v0"),
    Game("Minesweeper-v0-small"),
    Game("Sudoku-v0-very-easy"),
    Game("TowerOfHanoi-v0", seeded=False),
    Game("TowerOfHanoi-v0-medium", seeded=False),
)

DESCRIPTION = ("You are playing {game}, a single-player text game. Its rules and the board are in "
               "the first message. Each reply is one move, written in the form the rules ask for; "
               "the game answers with the new board. The game ends when you win, when you run "
               "out of moves, or after two invalid moves in a row.")


class GamesSetupError(WorkerSetupError):
    """The game venv is missing or broken."""


class GameWorker(JsonLinesWorker):
    """One game worker process (games_worker.py under .venv-games)."""

    def __init__(self, python: Path | str = DEFAULT_PYTHON, *, timeout_s: float = 60.0) -> None:
        super().__init__(python, WORKER, timeout_s=timeout_s, label=LABEL, setup=SETUP,
                         setup_error=GamesSetupError, venv=VENV)


class GameEnvSession:
    """One TextArena game at one seed behind the `EnvSession` interface (meta, reset, step,
    hint). Build it with `await GameEnvSession.open(worker, env_id, seed, lenient=...)`. The
    runner's action cap is twice the game's turn limit and one: an invalid move does not use
    a turn, and the second in a row ends the game, so the game always ends first."""

    def __init__(self, worker: JsonLinesWorker, env_id: str, seed: int, *, lenient: bool,
                 game_turns: int) -> None:
        self.worker, self.env_id, self.seed, self.lenient = worker, env_id, seed, lenient
        self.game_turns = game_turns
        self.meta = EnvMeta(name=f"textarena-{env_id}",
                            description=DESCRIPTION.format(game=env_id.split("-v")[0]),
                            max_turns=2 * game_turns + 1)
        self.outcome: dict[str, Any] | None = None

    @classmethod
    async def open(cls, worker: JsonLinesWorker, env_id: str, seed: int, *,
                   lenient: bool = False) -> GameEnvSession:
        r = await worker.request("reset", game=env_id, seed=seed, lenient=lenient)
        return cls(worker, env_id, seed, lenient=lenient, game_turns=int(r["max_turns"] or 50))

    async def reset(self, seed: int) -> ResetResult:
        """A new game at the session's own seed (the task's, whatever the runner passes)."""
        r = await self.worker.request("reset", game=self.env_id, seed=self.seed,
                                      lenient=self.lenient)
        self.outcome = None
        return ResetResult(str(r["observation"]), {"game": self.env_id, "seed": self.seed})

    async def step(self, action: str) -> StepResult:
        if self.outcome is not None:
            raise SandboxError("closed", "step after the game ended")
        r = await self.worker.request("step", action=action)
        if not r["done"]:
            return StepResult(str(r["observation"]), 0.0, False, False, {"turn": r["turn"]})
        self.outcome = r
        reward = min(1.0, max(0.0, float(r["reward"] or 0.0)))
        return StepResult(str(r["observation"]), reward, True, False,
                          {"reward": r["reward"], "reason": r["reason"],
                           "invalid_move": r["invalid_move"]})

    async def hint(self) -> str:
        return ""


def needs_lenient_replay(ep: Episode) -> bool:
    """Whether TextArena's lenient reading changes any action of the episode: a reply with no
    square bracket, which ActionFormattingWrapper wraps."""
    return any("[" not in t.action and "]" not in t.action for t in ep.turns)


@dataclass
class _Play:
    env: GameEnvSession | None
    ep: Episode | None
    error: str | None = None

    @property
    def reward(self) -> float:
        o = self.env.outcome if self.env is not None else None
        return min(1.0, max(0.0, float(o["reward"] or 0.0))) if o else 0.0

    @property
    def win(self) -> bool:
        o = self.env.outcome if self.env is not None else None
        return bool(o) and float(o["reward"] or 0.0) >= 1.0

    def summary(self) -> dict[str, Any]:
        o = (self.env.outcome if self.env is not None else None) or {}
        return {"reward": o.get("reward"), "win": self.win, "reason": o.get("reason"),
                "invalid_move": o.get("invalid_move"), "game_turns": o.get("turn"),
                "turns": len(self.ep.turns) if self.ep else 0,
                "truncated": bool(self.ep and self.ep.truncated), "error": self.error}


@dataclass
class TextArenaSuite:
    """`per_game` tasks of each seeded game of `games` (one of the others), round robin over
    the games, at seeds EVAL_SEED + k."""

    python: Path | str = DEFAULT_PYTHON
    games: tuple[Game, ...] = GAMES
    per_game: int = 8
    seed: int = EVAL_SEED
    episode_deadline_s: float = 1800.0
    worker_timeout_s: float = 60.0
    name: str = "textarena"
    pass_mark: float = 1.0
    _texts: list[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.python = Path(self.python)
        if self.per_game < 1:
            raise ValueError("per_game must be >= 1")

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        out = [EvalTask(f"{g.env_id}/{self.seed + k}", {"game": g.env_id, "seed": self.seed + k})
               for k in range(self.per_game) for g in self.games if g.seeded or k == 0]
        return out[:limit] if limit is not None else out

    def texts(self) -> list[str]:
        """Every task's first observation (the game's rules and its board at the seed)."""
        if self._texts is None:
            games = [[t.payload["game"], t.payload["seed"]] for t in self.tasks()]
            [self._texts] = worker_batch(self.python, WORKER, [{"op": "first", "games": games}],
                                         label=LABEL, setup=SETUP, error=GamesSetupError,
                                         venv=VENV)
        return list(self._texts)

    async def _play(self, task: EvalTask, policy: EvalPolicy, cfg: RolloutConfig, *,
                    lenient: bool) -> _Play:
        p = task.payload
        env = None
        try:
            async with GameWorker(self.python, timeout_s=self.worker_timeout_s) as worker:
                env = await GameEnvSession.open(worker, p["game"], p["seed"], lenient=lenient)
                ep = await policy.play(env, env_id=f"textarena/{task.task_id}", seed=p["seed"],
                                       cfg=cfg)
        except SandboxError as exc:
            return _Play(env, None, f"game worker: {exc}")
        error = ep.error
        if error is None and not ep.turns and ep.truncated:
            error = f"the first observation fills max_seq_len {policy.max_seq_len}"
        return _Play(env, ep, error)

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        cfg = RolloutConfig(temperature=0.0, max_tokens_per_turn=policy.max_tokens,
                            max_seq_len=policy.max_seq_len, request_deadline_s=policy.deadline_s,
                            episode_deadline_s=self.episode_deadline_s)
        strict = await self._play(task, policy, cfg, lenient=False)
        replay = strict.ep is not None and strict.error is None and needs_lenient_replay(strict.ep)
        lenient = await self._play(task, policy, cfg, lenient=True) if replay else strict
        tokens = sum(x.ep.generated_tokens for x in {id(strict): strict, id(lenient): lenient}
                     .values() if x.ep is not None)
        return TaskResult(
            task.task_id, strict.reward, strict.win,
            answer=transcript(strict.ep) if strict.ep else "", turns=len(strict.ep.turns)
            if strict.ep else 0, completion_tokens=tokens, error=strict.error,
            lenient=lenient.reward, lenient_passed=lenient.win,
            detail={"game": task.payload["game"], "seed": task.payload["seed"],
                    **strict.summary(), "lenient_replayed": replay,
                    "lenient": lenient.summary() if replay else None,
                    "path": strict.ep.path if strict.ep else policy.path})
