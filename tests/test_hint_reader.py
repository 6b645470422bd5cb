"""Leaks beyond the hint's own words (issue 31): the answers a hint gives in another form, read
by rule; the model check of the hint (a reader asked for the answer with the hint and
without), in the real sandbox with a scripted reader and through the CLI with no endpoint up;
and play-time wins out of the unhinted group's reach."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import RegretConfig, SandboxConfig, ValidationConfig
from spade_async.envs.hint_decode import decoded_answers, words_to_numbers
from spade_async.envs.hint_leak import play_leak
from spade_async.envs.hint_reader import ASK, HintReader
from spade_async.envs.validate import validate
from spade_async.inference.errors import EndpointUnavailable
from spade_async.reward.regret import env_regret, unreached_wins
from spade_async.sandbox.runtime import Sandbox

CFG = SandboxConfig(slots=4, warm_workers=2, call_timeout_s=3.0)

# The secret is a fact the hint names in words no rule reads: only a model that knows the
# fact reads the answer off it.
FACTS = '''
import random
import re

FACTS = [("the number of legs of a spider", 8), ("the number of days in a week", 7),
         ("the number of months in a year", 12), ("the number of sides of a hexagon", 6),
         ("the number of minutes in an hour", 60), ("the number of hours in a day", 24)]


class Environment:
    name = "facts"
    description = "Name the secret number (1 to 99). Reply ANSWER: <n>."
    max_turns = 1

    def reset(self, seed):
        self.fact, self.n = random.Random(seed).choice(FACTS)
        return "Name the secret number (1 to 99). Reply ANSWER: <n>.", {}

    def step(self, action):
        m = re.findall(r"-?\\d+", action)
        ok = bool(m) and int(m[-1]) == self.n
        return ("Correct" if ok else "Wrong"), float(ok), True, False, {}

    def hint(self):
        return HINT
'''
LEAKY = FACTS.replace("HINT", "f'The secret is {self.fact}.'")
HONEST = FACTS.replace("HINT", "'It is ' + ('even' if self.n % 2 == 0 else 'odd') + '.'")
KNOWN = {"spider": 8, "week": 7, "year": 12, "hexagon": 6, "hour": 60, "day": 24}


@dataclass
class Out:
    text: str


class ScriptedReader:
    """A chat 'model' that knows the facts: with a hint naming one it answers its number."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.asked = fail, []

    async def chat(self, messages, **kw):
        self.asked.append((messages, kw))
        if self.fail:
            raise EndpointUnavailable("no endpoint up", endpoint="x")
        system = messages[0]["content"]
        hint = re.search(r"Privileged hint[^:]*: (.*)", system)
        for word, n in KNOWN.items():
            if hint and re.search(rf"\b{word}\b", hint.group(1)):
                return Out(f"ANSWER: {n}")
        return Out("ANSWER: 5")


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        yield sb


async def test_the_reader_rejects_a_hint_it_reads_the_answer_off(sandbox):
    reader = ScriptedReader()
    cheap = await validate(LEAKY, sandbox)  # every rule passes it: it takes a model
    assert cheap.accepted and cheap.checks[-1].passed is None
    report = await validate(LEAKY, sandbox, reader=HintReader(reader, "m"))
    assert not report.accepted
    check = report.failures[0]
    assert check.name == "hint_reader" and "the hint reader (model m, 24 tokens" in check.reason
    assert "3 of 3 episodes with the hint against 0 of 3 without" in check.reason
    # asked for a bare answer, at the configured budget, with the hint and without
    assert all(ASK in m[0]["content"] and kw["max_tokens"] == 24 and kw["temperature"] == 0
               for m, kw in reader.asked)
    assert sum("Privileged hint" in m[0]["content"] for m, _ in reader.asked) == 3
    assert len(reader.asked) == 6


async def test_the_reader_passes_a_hint_that_only_narrows(sandbox):
    report = await validate(HONEST, sandbox, reader=HintReader(ScriptedReader(), "m"))
    assert report.accepted, report.as_dict()
    assert report.checks[-1].passed is True and "0 of 3 with the hint" in report.checks[-1].reason


async def test_the_model_check_without_an_answer_is_not_run_never_passed(sandbox):
    down = await validate(LEAKY, sandbox, reader=HintReader(ScriptedReader(fail=True), "m"))
    last = down.checks[-1]
    assert last.name == "hint_reader" and last.passed is None
    assert last.reason.startswith("not run: the endpoint failed")
    assert "checked by rule only" in last.reason
    off = await validate(LEAKY, sandbox, ValidationConfig(reader=False),
                         reader=HintReader(ScriptedReader(), "m"))
    assert off.checks[-1].reason.startswith("not run: validation.reader is off")
    # the model check runs only once the cheap checks pass
    broken = LEAKY.replace("float(ok), True", "1.0, True")
    asked = ScriptedReader()
    bad = await validate(broken, sandbox, reader=HintReader(asked, "m"))
    assert not bad.accepted and not asked.asked
    assert bad.checks[-1].reason == "not run: an earlier check failed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_validate_offline_says_the_model_check_was_not_run(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text(LEAKY)
    cfg = tmp_path / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n\n[[endpoints]]\nname = "dead"\n'
                   f'base_url = "http://127.0.0.1:{_free_port()}"\n')
    res = CliRunner().invoke(app, ["env", "validate", str(leaky), "--config", str(cfg)])
    assert res.exit_code == 0, res.output  # the rules pass it; the model did not get to say
    assert "skip hint_reader: not run: no endpoint of group default answered (dead at " \
        in res.stdout, res.stdout
    assert "checked by rule only, not by a model" in res.stdout


def test_decoded_answers_read_the_common_forms():
    def values(hint: str, obs: str = "") -> set[str]:
        return {v for _, v in decoded_answers(hint, obs)}

    assert "42" in values("The answer is forty-two.")
    assert "305" in values("three hundred and five")
    assert "42" in values("Digit by digit: four two")
    assert "-7" in values("minus seven")
    assert "42" in values("Read it backwards: 24")
    assert "hello" in values("the word is olleh")
    assert "hello" in values("Spell it: h-e-l-l-o")
    assert "402" in values("Its digits in order: 4, 0, 2.")
    assert "hello" in values("It starts 'hel' and ends 'lo'")
    assert "47" in values("The answer is 3 less than 50")
    assert "42" in values("half of 84") and "42" in values("twice 21")
    assert "42" in values("In hexadecimal it is 0x2a") and "42" in values("XLII")
    assert "42" in values("101010 in base 2")
    # the task's own operands with a method: not the answer
    assert "408" not in values("Multiply 12 by 34: 12 times 34", "What is 12 * 34?")
    assert "408" in values("It is 12 times 34", "Name the secret number.")
    # nothing the hint already says verbatim
    assert "42" not in values("It is 42, or forty-two")
    assert words_to_numbers("I have twenty one apples")[0] == "I have 21 apples"


def test_play_leak_counts_decoded_copies():
    assert play_leak("The answer is 3 less than 50.", ["ANSWER: 47"]) == 1.0
    assert play_leak("The answer is forty-two.", ["42"]) == 1.0
    assert play_leak("Multiply 12 by 34, that is 12 times 34.", ["408"], "What is 12 * 34?") == 0.0
    assert play_leak("The number is odd.", ["ANSWER: 7"]) == 0.0


def test_unreached_hinted_wins_count_as_copies():
    cfg = RegretConfig()
    bare = [(1.0, ["ANSWER: 47"]), (1.0, ["47"])]
    copies, why = unreached_wins([0.0] * 8, bare, cfg)
    assert copies == [1.0, 1.0] and why.startswith("unreached: 2 of 2 hinted episodes")
    reasoned = [(1.0, ["50 minus 3 is 47, so ANSWER: 47"]), (1.0, ["ANSWER: 47"])]
    assert unreached_wins([0.0] * 8, reasoned, cfg)[0] == [0.0, 1.0]
    # in the unhinted group's reach, or not won often enough, or switched off: nothing flagged
    assert unreached_wins([0.0] * 7 + [1.0], bare, cfg) == ([0.0, 0.0], "")
    assert unreached_wins([0.0] * 8, [(1.0, ["47"]), (0.0, ["3"])], cfg) == ([0.0, 0.0], "")
    assert unreached_wins([0.0] * 8, bare, RegretConfig(unreached_bare_words=0))[1] == ""
    r = env_regret([0.0] * 8, [1.0, 1.0], cfg, copies, why)
    assert r.leak_flagged and r.designer_reward == 0.0 and r.leak_reason == why
    assert env_regret([0.0] * 8, [1.0, 1.0], cfg, [0.0, 0.0], "x").leak_reason == ""


ECHO_PAID = '''
import random


class Environment:
    name = "echo_paid"
    description = "Name the animal that fits the clue."
    max_turns = 1

    def reset(self, seed):
        self.word = random.Random(seed).choice(["otter", "heron", "lynx", "bison", "gecko"])
        return f"Clue: it rhymes with nothing. The task word is '{self.word}'.", {}

    def step(self, action):
        ok = self.word in action.lower()
        return ("Right" if ok else "Wrong"), float(ok), True, False, {}

    def hint(self):
        return "It lives near water or in the mountains."
'''


def test_bench_validation_times_before_and_after_side_by_side(tmp_path):
    """`spade bench validation`: the arms side by side; what only the new checks catch is
    accepted before and rejected after, naming the probe."""
    echo, leaky = tmp_path / "echo_paid.py", tmp_path / "leaky.py"
    echo.write_text(ECHO_PAID)
    leaky.write_text(FACTS.replace("self.fact, self.n = random.Random(seed).choice(FACTS)",
                                   "self.n = random.Random(seed).randint(100, 999)")
                     .replace("HINT", "f'Read it backwards: {str(self.n)[::-1]}'"))
    res = CliRunner().invoke(app, ["bench", "validation", str(echo), str(leaky), "--reps", "1",
                                   "--no-model-check", "--json"])
    assert res.exit_code == 0, res.output
    out = __import__("json").loads(res.stdout)
    assert set(out["arms"]) == {"before", "rules"} and out["model_check"].startswith("not run")
    assert out["arms"]["before"]["rejected"] == {}
    rejected = out["arms"]["rules"]["rejected"]
    assert "observation echo" in rejected["echo_paid"]
    assert "the hint decoded" in rejected["leaky"]
    assert out["arms"]["before"]["median_ratio"] == 1.0
