"""The Environment Designer role: prompt, request and code extraction for one design.

A design is one completion for (document excerpt, contract, examples from memory). It is
token-exact like an episode: the sample is the prompt ids plus the sampled ids (mask 1) with their
behaviour log-probs. This module never validates or stores; the daemon does that with the sandbox
and the memory.
"""

from __future__ import annotations

import ast
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from spade_async.envs.contract import ALLOWED_IMPORTS
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool

CONTRACT = f"""Write ONE Python module (standard library only; allowed imports: \
{", ".join(sorted(ALLOWED_IMPORTS))}) that defines a class named Environment:

class Environment:
    name: str            # short slug
    description: str     # what the agent must do and the exact action format
    max_turns: int = 8   # agent actions before the episode is truncated
    tools: list = []     # optional OpenAI function-tool schemas the agent may call
    params: dict = {{}}    # optional difficulty knobs, e.g. {{"digits": {{"type": "int", "min": 1, "max": 6, "default": 3}}}} (min is the easiest)

    def reset(self, seed: int, params: dict = None) -> tuple[str, dict]: ...   # first observation, info; deterministic per seed (use random.Random(seed)); params: every knob's value
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...  # obs, reward, terminated, truncated, info
    def hint(self) -> str: ...           # privileged hint that makes this episode much easier
    def solution(self) -> list[str]: ... # actions that reach full score from reset(seed)

Rules: rewards lie in [0, 1] and an episode's rewards sum to at most 1; step never raises and ends
the episode within max_turns; a constant or random action must not score; a tool call arrives as
the JSON text {{"tool": "<name>", "arguments": {{...}}}}. No eval, exec, open, getattr or dunder
attributes. Reply with the module in one ```python block."""


@dataclass
class Design:
    design_id: str
    doc_id: str
    chunk_id: str
    policy_version: int
    model: str
    text: str
    code: str | None
    prompt_len: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # The move (DESIGN §12): "write" a new module, or "edit" the knobs of the stored
    # environment `parent` (its code, with `params`; see spade_async/design/edit.py).
    move: str = "write"
    parent: str | None = None
    params: dict[str, Any] | None = None
    allowed: list[list[int]] | None = None  # per sampled token, under a choice constraint
    error: str = ""  # why an edit has no params
    path: str = "tokens"  # tokens (ids and log-probs: trainable) or chat (text: a frozen
    # designer on any OpenAI-compatible server)
    completion_tokens: int = 0  # sampled, whichever path

    @property
    def trainable(self) -> bool:
        return self.path == "tokens" and bool(self.token_ids)


def designer_messages(excerpt: str, examples: list[str]) -> list[dict[str, str]]:
    system = ("You are the Environment Designer. You turn a document into an executable, "
              "stateful training environment for a reasoning agent: a task grounded in the "
              "document that is hard without the hint and feasible with it.\n\n" + CONTRACT)
    parts = []
    for i, code in enumerate(examples, 1):
        parts.append(f"Example environment {i}:\n```python\n{code.strip()}\n```")
    parts.append(f"Document excerpt:\n<<<\n{excerpt.strip()}\n>>>\n\nWrite a new environment "
                 "grounded in this document.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str) -> str | None:
    """The module in the reply: the last fenced block defining `class Environment`, else the
    whole reply if it parses and defines it, else the last non-empty fenced block (code that
    misses the contract is still code: validation rejects it with its reason, and partial
    credit sees how far it got). None when the reply holds no code at all."""
    fenced = [b for b in _FENCE.findall(text) if b.strip()]
    blocks = [b for b in fenced if "class Environment" in b]
    candidates = list(reversed(blocks)) or [text]
    for code in candidates:
        code = code.strip() + "\n"
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        if "class Environment" in code:
            return code
    if blocks:
        return blocks[-1].strip() + "\n"
    return fenced[-1].strip() + "\n" if fenced else None


async def design(
    pool: EndpointPool,
    chat: ChatTokens,
    *,
    doc_id: str,
    chunk_id: str,
    excerpt: str,
    examples: list[str],
    model: str,
    policy_version: int,
    max_tokens: int,
    temperature: float,
    max_seq_len: int,
    deadline_s: float | None,
    prefill: str = "",
    path: str = "tokens",
    group: str | None = None,
) -> Design:
    """`prefill` opens the reply (e.g. a code fence): its tokens end the prompt (mask 0), and
    the text the code is extracted from is prefill + what the model wrote. On the chat path
    (`path="chat"`: a frozen designer, any OpenAI-compatible server) the messages go as text
    and the reply is text only: no ids, no sample; `prefill` is asked for in words, since a
    chat API cannot open the assistant's turn."""
    if path == "chat":
        messages = designer_messages(excerpt, examples)
        out = await pool.chat(messages, model=model, max_tokens=max_tokens,
                              temperature=temperature, deadline_s=deadline_s,
                              token_level=False, group=group)
        return Design(
            design_id=f"d-{uuid.uuid4().hex[:12]}", doc_id=doc_id, chunk_id=chunk_id,
            policy_version=policy_version, model=model, text=out.text,
            code=extract_code(out.text), path="chat", completion_tokens=out.completion_tokens)
    head = chat.encode(prefill) if prefill else []

    def build(examples: list[str]) -> list[int]:
        return chat.prompt_ids(designer_messages(excerpt, examples)) + head

    prompt = build(examples)
    budget = min(max_tokens, max_seq_len - len(prompt))
    while budget < 64 and examples:  # examples that crowd out the reply go first
        examples = examples[:-1]
        prompt = build(examples)
        budget = min(max_tokens, max_seq_len - len(prompt))
    out = await pool.complete(prompt, model=model, max_tokens=max(budget, 1),
                              temperature=temperature, deadline_s=deadline_s, group=group)
    text = prefill + chat.decode(out.token_ids)
    return Design(
        design_id=f"d-{uuid.uuid4().hex[:12]}", doc_id=doc_id, chunk_id=chunk_id,
        policy_version=policy_version, model=model, text=text, code=extract_code(text),
        prompt_len=len(prompt), token_ids=list(prompt) + list(out.token_ids),
        loss_mask=[0] * len(prompt) + [1] * len(out.token_ids),
        logprobs=[0.0] * len(prompt) + list(out.logprobs),
        completion_tokens=len(out.token_ids),
    )
