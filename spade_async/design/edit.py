"""The designer's edit move (DESIGN §12, as ACCEL edits levels): new knob values for a stored
environment, chosen from a list of neighbouring settings under the server's structured outputs.

Why a choice list: the answer is always a valid setting (SmolLM2-135M writes no valid module,
but it can pick), the move stays small like ACCEL's mutations, and the constraint is one the
trainer can rebuild exactly (spade_async/inference/constrained.py), which is what keeps the importance
ratio honest: vLLM reports the log-probs of the *constrained* distribution (the grammar's
bitmask is applied to the logits before they are computed), so the trainer renormalises its own
over the same allowed ids.

An edit is a `Design` with move "edit": the family's code, the new params and, per sampled
token, the allowed ids. The daemon validates, plays and rewards it exactly like a written one.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spade_async.design.designer import Design
from spade_async.envs.contract import ParamSpec
from spade_async.envs.knob_steps import move_direction, neighbour_values
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.constrained import (
    ConstraintError,
    TokenBytes,
    choice_allowed_sets,
    chosen,
)
from spade_async.inference.pool import EndpointPool


@dataclass(frozen=True)
class VariantView:
    """What the designer is shown of one played variant."""

    params: dict[str, Any]
    episodes: int
    solve_rate: float | None  # mean unhinted score
    hinted_rate: float | None


def render_params(params: dict[str, Any]) -> str:
    """The text of a setting in prompts and answers: sorted keys, JSON."""
    return json.dumps(params, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def wanted_direction(solve_rate: float | None, episodes: int, min_episodes: int,
                     band: tuple[float, float] = (0.0, 1.0)) -> str:
    """Which way the parent's knobs should move (ACCEL edits near the frontier): when it was
    played (at least `min_episodes` unhinted episodes), "easier" when it was never solved or
    solved less often than `band`'s low end, "harder" when always solved or more often than
    its high end; "either" otherwise (inside the band, or not measured yet)."""
    if solve_rate is None or episodes < max(1, min_episodes):
        return "either"
    if solve_rate <= 0.0 or solve_rate < band[0]:
        return "easier"
    return "harder" if solve_rate >= 1.0 or solve_rate > band[1] else "either"


def candidate_params(specs: Sequence[ParamSpec], current: dict[str, Any], rng: random.Random,
                     limit: int, direction: str = "either") -> list[dict[str, Any]]:
    """Neighbours of `current`: one knob moved one step on its scale
    (`envs.knob_steps.neighbour_values`), only moves toward the knob's easy end when
    `direction` is "easier", only away from it when "harder". At most `limit`, drawn evenly
    over the knobs, in a shuffled order so the list's position carries no hint."""
    per_knob: list[list[dict[str, Any]]] = []
    for spec in specs:
        v = current[spec.name]
        per_knob.append([{**current, spec.name: x} for x in neighbour_values(spec, v)
                         if direction == "either" or move_direction(spec, v, x) == direction])
    out: list[dict[str, Any]] = []
    while len(out) < limit and any(per_knob):  # round robin over knobs
        for options in per_knob:
            if options and len(out) < limit:
                out.append(options.pop(rng.randrange(len(options))))
    rng.shuffle(out)
    return out


def frontier_options(specs: Sequence[ParamSpec], current: dict[str, Any], rng: random.Random,
                     limit: int, direction: str) -> tuple[list[dict[str, Any]], str]:
    """The settings an edit offers the designer, and how they were drawn: the neighbours in
    `direction` (`wanted_direction`). The policy still picks among them.

    A parent inside the band (or not measured yet: "either") is offered its own setting
    beside its neighbours: it is at the frontier already, and one step from it is often off
    the frontier (in a 60-minute embedded run arithmetic's in-band parent, single-digit sums
    solved 0.56, had only harder neighbours, solved 0.02-0.12, and the median play was
    0.125); ACCEL too trains on the levels it edits. When no knob can move the wanted way
    (unsolved at the easiest point, or always solved at the hardest), the offer falls back
    ("fallback") to the neighbours in both directions plus the parent's own setting: no
    setting is nearer the frontier, and playing the parent again re-measures a rate taken
    from a few episodes. When fewer than two settings are on offer (one knob one step from
    its end), the parent's own setting joins them too, so there is still a choice to make.
    The parent's setting counts toward `limit`."""
    out = candidate_params(specs, current, rng, limit, direction)
    drawn = direction
    if not out and direction != "either":
        out, drawn = candidate_params(specs, current, rng, limit, "either"), "fallback"
    if (drawn in ("either", "fallback") or len(out) < 2) and current not in out:
        out = out[:limit - 1] + [dict(current)]
        rng.shuffle(out)
    return out, drawn


SIGNAL_TEXT = {
    "hint_gap": "the agent should fail without the hint and succeed with it",
    "learnability": "the agent should solve it about half of the time: neither always nor never",
    "both": "the agent should solve it about half of the time without the hint, and the hint "
            "should help",
}


def _knob_line(spec: ParamSpec) -> str:
    if spec.type in ("int", "float"):
        rng_text = f"{spec.type} from {spec.min} to {spec.max}"
    elif spec.type == "bool":
        rng_text = "true or false"
    else:
        rng_text = "one of " + ", ".join(json.dumps(c) for c in spec.choices or ())
    desc = f": {spec.description}" if spec.description else ""
    return f"- {spec.name} ({rng_text}, default {json.dumps(spec.default)}){desc}"


def edit_messages(name: str, description: str, specs: Sequence[ParamSpec],
                  current: dict[str, Any], played: Sequence[VariantView],
                  options: Sequence[str], signal: str) -> list[dict[str, str]]:
    system = ("You are the Environment Designer. You tune the difficulty knobs of a training "
              "environment so that it teaches the agent the most: "
              f"{SIGNAL_TEXT[signal]}. Answer with one of the options, copied exactly.")
    lines = [f"Environment: {name}", f"Task: {description.strip()[:600]}", "Knobs:"]
    lines += [_knob_line(s) for s in specs]
    if played:
        lines.append("Played so far (settings: episodes, solved without hint, with hint):")
        for v in played:
            rate = "-" if v.solve_rate is None else f"{v.solve_rate:.2f}"
            hinted = "-" if v.hinted_rate is None else f"{v.hinted_rate:.2f}"
            lines.append(f"- {render_params(v.params)}: {v.episodes}, {rate}, {hinted}")
    lines.append(f"Current settings: {render_params(current)}")
    lines.append("Options:")
    lines += [f"- {o}" for o in options]
    lines.append("Which settings next?")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


async def propose_edit(pool: EndpointPool, chat: ChatTokens, vocab: TokenBytes, *,
                       env_id: str, name: str, description: str, specs: Sequence[ParamSpec],
                       current: dict[str, Any], played: Sequence[VariantView],
                       candidates: Sequence[dict[str, Any]], signal: str, model: str,
                       policy_version: int, temperature: float,
                       deadline_s: float | None, path: str = "tokens",
                       group: str | None = None, structured: bool = False) -> Design:
    """One edit: the model picks among `candidates` under a choice constraint. The Design's
    `params` is the chosen setting (None when the reply was cut short or broke the
    constraint: an invalid design, as a module that does not parse is), and `allowed` holds
    the constraint's allowed ids per sampled token. On the chat path (a frozen designer) the
    choice is a JSON-schema enum where the server has structured outputs (`structured`), else
    the reply is matched against the options; no ids, no sample."""
    options = [render_params(c) for c in candidates]
    if path == "chat":
        return await _propose_edit_chat(
            pool, env_id=env_id, options=options, candidates=candidates, model=model,
            messages=edit_messages(name, description, specs, current, played, options, signal),
            policy_version=policy_version, temperature=temperature, deadline_s=deadline_s,
            group=group, structured=structured)
    prompt = chat.prompt_ids(edit_messages(name, description, specs, current, played, options,
                                           signal))
    # Every option spelled one byte per token, plus the stop token: the answer always fits.
    budget = max(len(o.encode()) for o in options) + 2
    out = await pool.complete(prompt, model=model, max_tokens=budget, temperature=temperature,
                              deadline_s=deadline_s, group=group,
                              extra={"structured_outputs": {"choice": options}})
    sampled = list(out.token_ids)
    params: dict[str, Any] | None = None
    allowed: list[list[int]] | None = None
    error = ""
    try:
        allowed = choice_allowed_sets(vocab, options, sampled)
        pick = chosen(vocab, options, sampled)
        if pick is None:
            error = f"the answer stopped before completing an option ({out.finish_reason})"
        else:
            params = candidates[options.index(pick)]
    except ConstraintError as exc:
        error = f"the server's answer broke the choice constraint: {exc}"
    return Design(
        design_id=f"e-{uuid.uuid4().hex[:12]}", doc_id=f"edit:{env_id}", chunk_id=env_id,
        policy_version=policy_version, model=model, text=chat.decode(sampled), code=None,
        prompt_len=len(prompt), token_ids=list(prompt) + sampled,
        loss_mask=[0] * len(prompt) + [1] * len(sampled),
        logprobs=[0.0] * len(prompt) + list(out.logprobs),
        move="edit", parent=env_id, params=params, allowed=allowed, error=error,
        completion_tokens=len(sampled),
    )


def match_option(reply: str, options: Sequence[str]) -> str | None:
    """The option a free-text reply names: a JSON string holding one, the reply itself, or
    the only option found inside it (compared without spaces)."""
    text = reply.strip()
    try:
        loaded = json.loads(text)
        if isinstance(loaded, str):
            text = loaded.strip()
        elif isinstance(loaded, dict):
            text = render_params(loaded)
    except ValueError:
        pass
    squash = {"".join(o.split()): o for o in options}
    flat = "".join(text.split())
    if flat in squash:
        return squash[flat]
    found = [o for k, o in squash.items() if k in flat]
    return found[0] if len(found) == 1 else None


async def _propose_edit_chat(pool: EndpointPool, *, env_id: str, options: list[str],
                             candidates: Sequence[dict[str, Any]], model: str,
                             messages: list[dict[str, str]], policy_version: int,
                             temperature: float, deadline_s: float | None, group: str | None,
                             structured: bool) -> Design:
    extra = None
    if structured:
        schema = {"type": "string", "enum": options}
        extra = {"response_format": {"type": "json_schema",
                                     "json_schema": {"name": "settings", "schema": schema}}}
    budget = 2 * max(len(o) for o in options) + 16
    out = await pool.chat(messages, model=model, max_tokens=budget, temperature=temperature,
                          deadline_s=deadline_s, token_level=False, group=group, extra=extra)
    pick = match_option(out.text, options)
    return Design(
        design_id=f"e-{uuid.uuid4().hex[:12]}", doc_id=f"edit:{env_id}", chunk_id=env_id,
        policy_version=policy_version, model=model, text=out.text, code=None,
        move="edit", parent=env_id, path="chat", completion_tokens=out.completion_tokens,
        params=None if pick is None else dict(candidates[options.index(pick)]),
        error="" if pick is not None else f"the reply names none of the options: "
                                          f"{out.text.strip()[:80]!r}")
