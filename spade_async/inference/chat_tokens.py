"""Token-exact chat turns: the ids a multi-turn episode is trained on are the ids the server saw.

The first prompt is the chat template rendered and tokenized here, once. After that, each model
turn's sampled ids are kept as they came back, and only the text *between* turns (the end of the
assistant turn, the observation as a user message, the next assistant header) is tokenized, from
the template's own rendering. The next request sends the whole id sequence as the prompt, so the
server never re-tokenizes text that was sampled. Templates whose rendering is not prefix-stable
(history re-rendered differently) are refused at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_P = "\u2063SPADE-PLACEHOLDER\u2063"


class TemplateError(ValueError):
    """The tokenizer's chat template cannot give token-exact multi-turn sequences."""


class ChatTokens:
    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        self._with_assistant = self._render([*base, {"role": "assistant", "content": _P}], False)
        self._base = base
        i = self._with_assistant.rfind(_P)
        if i < 0:
            raise TemplateError("the chat template drops assistant content")
        self.end_of_turn = self._with_assistant[i + len(_P):]
        probe = self._render([*base, {"role": "assistant", "content": _P},
                              {"role": "user", "content": "o"}], True)
        if not probe.startswith(self._with_assistant):
            raise TemplateError("the chat template re-renders earlier turns when a turn is "
                                "added; token-exact multi-turn sequences are impossible with it")
        self.eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        marker = self.encode(self.end_of_turn)
        if marker and self.tok.convert_ids_to_tokens(marker[0]) in tokenizer.all_special_tokens:
            self.eos_ids.add(marker[0])  # e.g. <|im_end|>, when it is not the eos token

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ChatTokens:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def _render(self, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(list(messages), tokenize=False,
                                            add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The opening prompt (system + first user message), ready for the assistant."""
        return self.encode(self._render(messages, True))

    def next_turn_ids(self, completion_ids: Sequence[int], user_text: str) -> list[int]:
        """Ids between a sampled assistant turn and the next one: close the assistant turn
        (unless the model's own end-of-turn token already did), the user message, and the
        assistant header."""
        tail = self._render([*self._base, {"role": "assistant", "content": _P},
                             {"role": "user", "content": user_text}], True)
        tail = tail[len(self._with_assistant):]
        close = self.end_of_turn
        if completion_ids and completion_ids[-1] in self.eos_ids:
            said = self.tok.decode([completion_ids[-1]], skip_special_tokens=False)
            if close.startswith(said):
                close = close[len(said):]
        return self.encode(close + tail)
