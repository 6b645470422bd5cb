"""Code extraction from designer replies and the designer prompt's shape."""

from __future__ import annotations

import pytest

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.design.designer import design, designer_messages, extract_code
from spade_async.inference.pool import EndpointPool
from spade_async.testing.scripted import ENV_CODE


def test_extracts_the_last_parsable_environment_block():
    reply = ("Here is one:\n```python\nclass Environment:\n    name = 'a'\n```\nand better:\n"
             "```python\nimport random\n\nclass Environment:\n    name = 'b'\n```\n")
    assert extract_code(reply) == "import random\n\nclass Environment:\n    name = 'b'\n"
    assert extract_code("class Environment:\n    name = 'c'") == "class Environment:\n    name = 'c'\n"
    assert extract_code("I cannot do that.") is None
    # An unclosed fence at the end of a truncated reply still yields its code for validation.
    assert extract_code("```python\nclass Environment:\n    def f(:\n").startswith("class Env")


def test_prompt_carries_contract_examples_and_excerpt():
    msgs = designer_messages("The heapq module implements a priority queue.", ["class Environment: ..."])
    assert msgs[0]["role"] == "system" and "def hint(self) -> str" in msgs[0]["content"]
    assert "Example environment 1" in msgs[1]["content"]
    assert "priority queue" in msgs[1]["content"]


@pytest.mark.parametrize("prefill", ["```python\n", ""])
async def test_prefill_opens_the_reply_as_prompt_tokens(fake, prefill):
    server, chat = fake
    async with EndpointPool([EndpointConfig(name="f", base_url=server.base_url)],
                            PoolConfig()) as pool:
        d = await design(pool, chat, doc_id="d", chunk_id="d#0", excerpt="Countdowns.",
                         examples=[], model="policy", policy_version=0, max_tokens=512,
                         temperature=1.0, max_seq_len=4096, deadline_s=30, prefill=prefill)
    assert d.code is not None and d.code.strip() == ENV_CODE.strip()
    assert d.text.startswith("```python\n")
    sent = server.state.completions[0]["prompt"]
    assert d.token_ids[: len(sent)] == sent and d.prompt_len == len(sent)
    head = chat.encode(prefill)
    assert sent[len(sent) - len(head):] == head  # the prefill ends the prompt (mask 0)
    assert d.loss_mask == [0] * len(sent) + [1] * (len(d.token_ids) - len(sent))
