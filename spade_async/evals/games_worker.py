"""TextArena game worker: runs under `.venv-games/bin/python -I` (textarena and the few packages
its import needs, see scripts/setup-games.sh), never under the spade venv, so it imports only the
standard library and textarena. JSON lines on stdin/stdout: one request object in, one reply
out, `{"result": ...}` or `{"error": "..."}`.

One process plays at most one game at a time:
  ping   {}                      -> {pong, textarena}: the package's version
  first  {games: [[id, seed]]}   -> the first observation of each game at its seed (texts)
  reset  {game, seed, lenient}   -> {observation, max_turns}: a new game of a registered
                                    single-player id, without textarena's wrappers, or with
                                    `lenient` its ActionFormattingWrapper alone (a reply with no
                                    square brackets is wrapped in them, as textarena's default
                                    registrations read replies)
  step   {action}                -> {observation, done, reward, reason, invalid_move, turn}

Observations are the game's own messages to the player since the last one, without the echo of
the player's own action; a finished game's reason follows "Game over:".

Offline by construction: textarena's word games download NLTK corpora at import or reset;
here `nltk.download` and every socket connection raise, so a game that needs the network fails
loudly instead of fetching anything. TextArena seeds the global `random` at each reset, which is
one more reason each game has a process of its own.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any


def _offline(*_a: Any, **_k: Any) -> Any:
    raise OSError("the game worker is offline: no network, no downloads")


socket.socket.connect = _offline  # type: ignore[method-assign]
socket.socket.connect_ex = _offline  # type: ignore[method-assign]
socket.create_connection = _offline  # type: ignore[assignment]

import nltk  # noqa: E402  (textarena imports it; its downloader must never run)

nltk.download = _offline

import textarena as ta  # noqa: E402
from textarena.core import ObservationType  # noqa: E402
from textarena.envs.registration import ENV_REGISTRY  # noqa: E402
from textarena.wrappers import ActionFormattingWrapper  # noqa: E402

MAX_ACTION_CHARS = 20_000


class RequestError(Exception):
    """A malformed request: answered with {"error": ...}, the worker carries on."""


def _text(messages: list[Any]) -> str:
    return "\n".join(str(m).strip() for _, m, kind in messages
                     if kind != ObservationType.PLAYER_ACTION and str(m).strip())


def _make(game: Any, lenient: bool = False) -> Any:
    if not isinstance(game, str) or game not in ENV_REGISTRY:
        raise RequestError(f"no TextArena game {game!r}")
    env = ta.make(f"{game}-raw")  # the game alone: no observation or action wrappers
    return ActionFormattingWrapper(env) if lenient else env


def _seed(seed: Any) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise RequestError(f"a seed is an integer, got {seed!r}")
    return seed


class Session:
    def __init__(self) -> None:
        self.env: Any = None
        self.done = False

    def first(self, games: Any) -> list[str]:
        out = []
        for game, seed in games:
            env = _make(game)
            env.reset(num_players=1, seed=_seed(seed))
            out.append(_text(env.get_observation()[1]))
        return out

    def reset(self, game: Any, seed: Any, lenient: Any = False) -> dict[str, Any]:
        self.env, self.done = _make(game, bool(lenient)), False
        self.env.reset(num_players=1, seed=_seed(seed))
        return {"observation": _text(self.env.get_observation()[1]),
                "max_turns": getattr(self.env, "max_turns", None)}

    def step(self, action: Any) -> dict[str, Any]:
        if self.env is None or self.done:
            raise RequestError("no game in play: reset first")
        if not isinstance(action, str):
            raise RequestError("an action is a string")
        done, _info = self.env.step(action[:MAX_ACTION_CHARS])
        text = _text(self.env.get_observation()[1])
        state = self.env.state
        out: dict[str, Any] = {"observation": text, "done": bool(done), "reward": None,
                               "reason": None, "invalid_move": False, "turn": state.turn}
        if done:
            self.done = True
            rewards, game_info = self.env.close()
            info = (game_info or {}).get(0, {})
            out.update(reward=float((rewards or {}).get(0, 0.0)), reason=info.get("reason"),
                       invalid_move=bool(info.get("invalid_move")))
            out["observation"] = (text + "\n" if text else "") + f"Game over: {out['reason']}"
        return out


def main() -> None:
    # The protocol has stdout to itself: anything a game prints goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    session = Session()
    ops = {"ping": lambda: {"pong": True, "textarena": ta.__version__},
           "first": session.first, "reset": session.reset, "step": session.step}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = ops.get(req.pop("op", None)) if isinstance(req, dict) else None
            if op is None:
                raise RequestError(f"unknown op in {line[:80]!r}")
            reply: dict[str, Any] = {"result": op(**req)}
        except (RequestError, TypeError, ValueError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        except Exception as exc:  # a game's own bug on some input: reported, the worker lives
            reply = {"error": f"the game failed: {type(exc).__name__}: {exc}"[:2000]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
