"""The fake endpoint's policy for `spade bench soak`: a stationary stream of designs and turns
whatever the run's age (a pure function of the prompt and a design counter), and the fake in its
own process. Of every four designs: two are valid environments no earlier design wrote (the
novelty filter lets them in, so the memory grows as a real run's does), one is invalid code
(stored as rejected, with its code) and one is the document's own environment again (a duplicate
after its first time). Agent turns are a few hashed words off the tokenizer's vocabulary; one
episode in `solve_every` (by a hash of its first observation) relays the word it was shown, so
some unhinted groups vary and carry advantages while most, as with SmolLM2, do not."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from spade_async.inference.chat_tokens import ChatTokens
from spade_async.testing.scripted import MixedScript

INVALID = "```python\nclass Environment(:\n    name = 'broken'\n```"


class SoakScript(MixedScript):
    def __init__(self, chat: ChatTokens, design_tokens: int = 200, turn_tokens: int = 12,
                 solve_every: int = 48) -> None:
        super().__init__(chat, design_tokens=design_tokens, turn_tokens=turn_tokens)
        self.designs, self.solve_every = 0, solve_every

    def _turn(self, text: str, n_prompt: int) -> list[int]:
        shown = re.findall(r"Relay the word (\w+)", text)
        words = self._words(str(n_prompt) + text[-200:], self.turn_tokens // 2, self.vocab)
        if shown and int(hashlib.sha256(text[-400:].encode()).hexdigest(), 16) % \
                self.solve_every == 0:
            words[-1] = shown[-1]
        return self.chat.encode(" ".join(words))[: self.turn_tokens - 1] + [
            self.chat.tok.eos_token_id]

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = self.chat.tok.decode(prompt_ids)
        if "Environment Designer" not in text:
            return self._turn(text, len(prompt_ids))
        self.designs += 1
        excerpt = text.split("<<<")[-1].split(">>>")[0]
        key = hashlib.sha256(excerpt.encode()).hexdigest()[:8]
        kind = self.designs % 4
        # the document's own design is kept (a duplicate's source); fresh ones are not, so the
        # fake's memory stays flat over the run
        reply = (INVALID if kind == 1 else
                 self._designs.setdefault(key, self._design(key)) if kind == 2 else
                 self._design(f"{key}-{self.designs}"))
        if text.endswith("```python\n"):  # the designer opened the block (prefill)
            reply = reply.removeprefix("```python\n")
        return self.chat.encode(reply) + [self.chat.tok.eos_token_id]


class _Nothing(list):
    """A list that keeps nothing: the fake's per-request bookkeeping, off for a soak."""

    def append(self, item: Any) -> None:
        pass


def serve(port: int, tokenizer: str) -> None:
    import uvicorn

    from spade_async.testing.fake.app import build_app
    from spade_async.testing.fake.state import FakeState

    chat = ChatTokens.from_pretrained(tokenizer)
    state = FakeState(script=SoakScript(chat), decode=chat.decode,
                      eos_token_id=chat.tok.eos_token_id)
    state.keep_no_requests()
    state.models_seen = _Nothing()
    uvicorn.run(build_app(state), host="127.0.0.1", port=port, log_level="error",
                lifespan="off", access_log=False)


if __name__ == "__main__":
    import sys

    serve(int(sys.argv[1]), sys.argv[2])
