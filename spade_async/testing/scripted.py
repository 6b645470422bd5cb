"""A scripted policy for deterministic daemon runs against the fake endpoint: the designer's
first reply (per document) is a known valid environment, its second is unusable; the agent
answers correctly only when the privileged hint is in its prompt (so regret is exactly 1), in
its own environment and in the arithmetic seed family."""

from __future__ import annotations

import hashlib
import re

from spade_async.inference.chat_tokens import ChatTokens

ENV_CODE = '''import random
import re


class Environment:
    name = "countdown"
    description = "Reply with the number just below the one you are shown, each turn."
    max_turns = 3

    def reset(self, seed):
        self.n = random.Random(seed).randint(5, 9)
        self.good = 0
        self.turn = 0
        return f"below {self.n}", {}

    def step(self, action):
        self.turn += 1
        said = re.findall(r"-?\\d+", action)
        self.good += bool(said) and said[-1] == str(self.n - 1)
        self.n -= 1
        done = self.turn == 3
        reward = 1.0 if done and self.good == 3 else 0.0
        return ("done" if done else f"below {self.n}"), reward, done, False, {}

    def hint(self):
        return "count down by one"

    def solution(self):
        return [str(self.n - 1 - i) for i in range(3)]
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
            numbers = [str(int(n) - 1) for n in re.findall(r"below (\d+)", text)]
            # the arithmetic seed family: "What is 12 + 80? ..."
            sums = re.findall(r"What is (\d+(?: [-+*] \d+)+)\?", text)
            if sums:
                numbers = re.findall(r"\d+", sums[0])
            solves = "Privileged hint" in text or (
                self.unhinted_solves_even and bool(numbers) and int(numbers[0]) % 2 == 0)
            answer = (str(_arithmetic(sums[-1])) if sums else numbers[-1]) if numbers else "0"
            # a solved reply shows its step (a bare hinted win that no unhinted episode reaches
            # counts as a copy of the hint: regret.unreached_bare_words)
            reply = f"one step more gives {answer}" if solves else "0"
        return self.chat.encode(reply) + [self.chat.tok.eos_token_id]


def _arithmetic(expr: str) -> int:
    """`12 + 80 - 3` (and `*`), with the usual precedence."""
    tokens = expr.split()
    terms: list[int] = [int(tokens[0])]
    for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
        n = int(num)
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n if op == "+" else -n)
    return sum(terms)


RELAY_CODE = '''import random


class Environment:
    """{doc}"""

    name = "{name}"
    description = "{desc}"
    max_turns = 3

    def reset(self, seed):
        self.word = random.Random(seed).choice(("harbor", "lantern", "orbit", "quartz"))
        self.turn = 0
        return f"Relay the word {{self.word}}, one turn at a time.", {{}}

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.max_turns
        reward = float(done and self.word in action)
        return f"Turn {{self.turn}} relayed ({{len(action)}} chars).", reward, done, False, {{}}

    def hint(self):
        return f"the word is {{self.word}}"
'''

_WORDS = ("signal relay archive harbor lantern ledger orbit meadow quarry cipher beacon "
          "canyon ember glacier harvest island journal kernel lattice mosaic nebula oasis "
          "prism quartz ripple summit timber vertex willow zenith").split()


class MixedScript:
    """A stateless policy for the mixed-workload bench (`spade bench pipeline`): a design is
    a valid multi-turn environment of about `design_tokens` tokens, different for every
    document (its words come from a hash of the excerpt, so the memory's novelty filter lets
    it in); an agent turn is `turn_tokens` tokens. Replies are a pure function of the prompt,
    so a bare client replaying the daemon's requests gets the very same lengths."""

    def __init__(self, chat: ChatTokens, design_tokens: int = 760, turn_tokens: int = 24) -> None:
        self.chat, self.design_tokens, self.turn_tokens = chat, design_tokens, turn_tokens
        # Designs draw their words from thousands of the tokenizer's whole words: texts of a
        # few dozen words would embed too close together for the memory's novelty filter.
        vocab = chat.tok.get_vocab()
        words = {w[1:].lower() for w in vocab
                 if w.startswith("\u0120") and w[1:].isalpha() and 4 <= len(w) - 1 <= 10}
        self.vocab = sorted(words)
        self._designs: dict[str, str] = {}  # a pure function of the excerpt, computed once

    def _words(self, seed: str, n: int, vocab: list[str] | tuple[str, ...] = _WORDS) -> list[str]:
        import random

        rng = random.Random(hashlib.sha256(seed.encode()).digest())
        return [rng.choice(vocab) for _ in range(n)]

    def _design(self, key: str) -> str:
        words = self._words(key, 600, self.vocab)
        desc = " ".join(words[:12])
        room = self.design_tokens - len(self.chat.encode(
            RELAY_CODE.format(doc="", name=f"relay_{key}", desc=desc))) - 4
        doc, used = [], 0
        for w in words[12:]:  # the docstring pads the module to its length
            used += len(self.chat.encode(" " + w))
            if used > room:
                break
            doc.append(w)
        code = RELAY_CODE.format(doc=" ".join(doc), name=f"relay_{key}", desc=desc)
        return f"```python\n{code}```"

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = self.chat.tok.decode(prompt_ids)
        eos = [self.chat.tok.eos_token_id]
        if "Environment Designer" in text:
            excerpt = text.split("<<<")[-1].split(">>>")[0]
            key = hashlib.sha256(excerpt.encode()).hexdigest()[:8]
            reply = self._designs.get(key)
            if reply is None:
                reply = self._designs[key] = self._design(key)
            if text.endswith("```python\n"):  # the designer opened the block (prefill)
                reply = reply.removeprefix("```python\n")
            return self.chat.encode(reply) + eos
        words = self._words(str(len(prompt_ids)) + text[-200:], self.turn_tokens)
        return self.chat.encode(" ".join(words))[: self.turn_tokens - 1] + eos


def serve(port: int, tokenizer: str, token_latency_s: float = 0.0, mixed: bool = False,
          request_latency_s: float = 0.0) -> None:
    """The fake endpoint with this script (or the mixed bench's), in its own process (daemon
    crash tests, `spade bench pipeline`)."""
    import uvicorn

    from spade_async.testing.fake.app import build_app
    from spade_async.testing.fake.state import FakeState

    chat = ChatTokens.from_pretrained(tokenizer)
    script = MixedScript(chat) if mixed else Script(chat, per_document=True)
    state = FakeState(script=script, decode=chat.decode, eos_token_id=chat.tok.eos_token_id,
                      token_latency_s=token_latency_s, request_latency_s=request_latency_s)
    if mixed:  # a long benchmark must not keep every request body
        state.keep_no_requests()
    uvicorn.run(build_app(state), host="127.0.0.1", port=port, log_level="error",
                lifespan="off", access_log=False)


if __name__ == "__main__":
    import sys

    serve(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0,
          mixed=len(sys.argv) > 4 and sys.argv[4] == "mixed",
          request_latency_s=float(sys.argv[5]) if len(sys.argv) > 5 else 0.0)
