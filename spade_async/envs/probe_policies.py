"""The probe policies validation plays against an environment: fixed actions and actions made
for it, each repeated every turn; none of them may score at or above the exploit threshold.
Derived from the metadata and the solution alone; playing them is `sandboxed_checks.py`.
"""

from __future__ import annotations

import json
import random
import re
import string

from spade_async.envs.contract import EnvMeta
from spade_async.envs.hint_leak import answer_prefixes

# Probe policies: each repeats one action every turn. None of them may score >= the threshold.
# Besides these constants, each environment gets probes made for it (`probe_policies`): random
# text, the right format with wrong content, a verbose reply that sprays candidate answers, and
# well-formed calls of each of its tools with empty or wrong arguments.
PROBES: tuple[str, ...] = (
    "", "hello world lorem ipsum", "0", "1", "42", "yes", "A", '{"tool": "noop", "arguments": {}}',
)
# A long reply that contains many plausible answers: a verifier that pays when the answer
# appears anywhere in the reply (or pays for length) pays it.
VERBOSE = ("Let me think step by step. " + " ".join(str(i) for i in range(-20, 101))
           + " yes no true false none A B C D E R G Y O P left right up down north south east west"
           + " ANSWER: 1 ANSWER: 0 " + "lorem ipsum dolor sit amet " * 12).strip()


def _wrong_answer(solution: list[str]) -> str | None:
    """A plausible wrong answer: the solution's last action with its last number changed."""
    if not solution:
        return None
    last = solution[-1]
    nums = list(re.finditer(r"-?\d+", last))
    if nums:
        m = nums[-1]
        return last[: m.start()] + str(int(m.group()) + 1) + last[m.end():]
    return last + " not"


def short_action(action: str, n: int = 60) -> str:
    return repr(action if len(action) <= n else action[:n] + "...")


def probe_policies(meta: EnvMeta, solution: list[str] | None) -> list[tuple[str, str]]:
    """(label, action) of every probe policy for this environment, each repeated every turn."""
    out = [(f"constant {short_action(p)}", p) for p in PROBES]
    rng = random.Random(0)
    out.append(("random text", "".join(rng.choice(string.printable) for _ in range(40))))
    out.append(("verbose filler", VERBOSE))
    wrong = _wrong_answer(solution or [])
    if wrong is not None:
        out.append(("right format, wrong content", wrong))
    for prefix in answer_prefixes(solution):
        out.append((f"format only {short_action(prefix)}", prefix + "zzzz"))
        out.append((f"format with filler {short_action(prefix)}", prefix + VERBOSE))
    for tool in meta.tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            continue
        props = (fn.get("parameters") or {}).get("properties") or {}
        wrong_args = {k: ("zzzz" if (v or {}).get("type") == "string" else -987654)
                      for k, v in props.items() if isinstance(v, dict) or v is None}
        for what, args in (("empty", {}), ("wrong", wrong_args)):
            out.append((f"tool call {name} with {what} arguments",
                        json.dumps({"tool": name, "arguments": args})))
    seen: set[str] = set()
    return [(label, a) for label, a in out if not (a in seen or seen.add(a))]
