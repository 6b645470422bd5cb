"""A scripted policy for deterministic daemon runs against the fake endpoint: the designer's
first reply (per document) is a known valid environment, its second is unusable; the agent
answers correctly only when the privileged hint is in its prompt (so regret is exactly 1)."""

from __future__ import annotations

import hashlib
import re

from spade_async.chat_tokens import ChatTokens

ENV_CODE = '''import random


class Environment:
    name = "countdown"
    description = "Reply with the number you are shown, each turn."
    max_turns = 3

    def reset(self, seed):
        self.n = random.Random(seed).randint(5, 9)
        self.good = 0
        self.turn = 0
        return f"say {self.n}", {}

    def step(self, action):
        self.turn += 1
        self.good += action.strip() == str(self.n)
        self.n -= 1
        done = self.turn == 3
        reward = 1.0 if done and self.good == 3 else 0.0
        return ("done" if done else f"say {self.n}"), reward, done, False, {}

    def hint(self):
        return "repeat the number"

    def solution(self):
        return [str(self.n - i) for i in range(3)]
'''


class Script:
    """Designer: the first reply for a document is the known environment, later ones are
    unusable. Agent: correct answers only when the privileged hint is in its prompt.
    `per_document`: count designs per document excerpt (and name each env after it)."""

    def __init__(self, chat: ChatTokens, per_document: bool = False,
                 unhinted_solves_even: bool = False) -> None:
        self.chat, self.per_document = chat, per_document
        # Without a hint, solve the episodes whose first number is even: unhinted groups then
        # vary across seeds, so agent samples carry advantages (fixed-environment runs).
        self.unhinted_solves_even = unhinted_solves_even
        self.designs = 0
        self.by_doc: dict[str, int] = {}

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = self.chat.tok.decode(prompt_ids)
        if "Environment Designer" in text:
            self.designs += 1
            excerpt = text.split("<<<")[-1].split(">>>")[0]
            key = hashlib.sha256(excerpt.encode()).hexdigest()[:8] if self.per_document else ""
            self.by_doc[key] = self.by_doc.get(key, 0) + 1
            code = ENV_CODE.replace('"countdown"', f'"countdown_{key}"') if key else ENV_CODE
            reply = f"```python\n{code}```" if self.by_doc[key] == 1 else "I can't write that."
            if text.endswith("```python\n"):  # the designer opened the block (prefill)
                reply = reply.removeprefix("```python\n")
        else:
            numbers = re.findall(r"say (\d+)", text)
            solves = "Privileged hint" in text or (
                self.unhinted_solves_even and bool(numbers) and int(numbers[0]) % 2 == 0)
            reply = numbers[-1] if numbers and solves else "0"
        return self.chat.encode(reply) + [self.chat.tok.eos_token_id]


def serve(port: int, tokenizer: str, token_latency_s: float = 0.0) -> None:
    """The fake endpoint with this script, in its own process (daemon crash tests)."""
    import uvicorn

    from spade_async.testing.fake_openai import FakeState, build_app

    chat = ChatTokens.from_pretrained(tokenizer)
    state = FakeState(script=Script(chat, per_document=True), decode=chat.decode,
                      eos_token_id=chat.tok.eos_token_id, token_latency_s=token_latency_s)
    uvicorn.run(build_app(state), host="127.0.0.1", port=port, log_level="error",
                lifespan="off", access_log=False)


if __name__ == "__main__":
    import sys

    serve(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
