"""Code extraction from designer replies and the designer prompt's shape."""

from __future__ import annotations

from spade_async.designer import designer_messages, extract_code


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
