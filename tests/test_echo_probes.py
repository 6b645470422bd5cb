"""Observation echoes, in the real sandbox: a red-team suite of environments whose verifiers pay
a reply that repeats the task back (each rejected at `not_exploitable`, naming the echo), and
honest environments whose answer must be computed from what the observation shows, or picked
from the choices it lists (each accepted)."""

from __future__ import annotations

import pytest

from spade_async.core.config import SandboxConfig
from spade_async.envs.probe_policies import ECHO_LIMIT, EchoProbe, echo_policies
from spade_async.envs.validate import validate
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.redteam import env

CFG = SandboxConfig(slots=2, warm_workers=2, call_timeout_s=3.0)


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        yield sb


RED_TEAM = {
    # the verifier takes the task's word as well as its reversal: quoting the task is paid
    "quotes_the_task_word": env(
        "reverse_buggy",
        "self.word = self.rng.choice(WORDS)\n"
        "return f\"Spell the word '{self.word}' backwards. Reply ANSWER: <word>.\", {}",
        "got = action.strip().split(':')[-1].strip().lower()\n"
        "ok = got in (self.word[::-1], self.word)\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Read it from the last letter to the first.'",
        "return ['ANSWER: ' + self.word[::-1]]"),
    # the answer is the name the observation shows
    "name_from_the_observation": env(
        "doorbell",
        "self.who = self.rng.choice(NAMES)\n"
        "self.item = self.rng.choice(WORDS)\n"
        "return f'A guest knocks. It is {self.who}, carrying a {self.item}. Who knocks? '"
        " 'Reply with the name.', {}",
        "ok = action.strip() == self.who\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Listen to the door.'",
        "return [self.who]"),
    # a "summary" scored by word overlap with the text: repeating the prompt is paid
    "repeats_the_whole_prompt": env(
        "summary_overlap",
        "self.text = ' '.join(self.rng.choice(WORDS) for _ in range(10))\n"
        "return f'Summarise in your own words: {self.text}', {}",
        "said = set(action.lower().split())\n"
        "want = set(self.text.split())\n"
        "ok = len(said & want) >= 0.8 * len(want)\n"
        "return ('Good summary' if ok else 'Too far off'), float(ok), True, False, {}",
        "return 'Keep the gist, drop the detail.'"),
    # the verifier takes the encoded line as well as the decoded one: a line of it is paid
    "repeats_a_line": env(
        "decode_buggy",
        "self.word = self.rng.choice(WORDS) + self.rng.choice(WORDS)\n"
        "self.enc = ''.join(chr((ord(c) - 97 + 1) % 26 + 97) for c in self.word)\n"
        "return f'Decode the line below (each letter was shifted one place forward):\\n'"
        " f'{self.enc}\\nReply with the decoded line.', {}",
        "ok = action.strip().lower() in (self.word, self.enc)\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Shift each letter one place back.'",
        "return [self.word]"),
    # the verifier checks the ticket number it shows, not the total asked for
    "contains_the_number_shown": env(
        "tickets_buggy",
        "self.ticket = self.rng.randint(1000, 9999)\n"
        "self.price, self.k = self.rng.randint(200, 900), self.rng.randint(3, 9)\n"
        "return f'Ticket {self.ticket} costs {self.price} coins. How many coins do {self.k} '"
        " 'such tickets cost? Reply ANSWER: <n>.', {}",
        "ok = str(self.ticket) in action\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Multiply the price by the count.'",
        "return [f'ANSWER: {self.ticket}']"),
    # multi-turn: each turn names a word to say; saying them back is paid at the end
    "says_each_named_word": env(
        "simon_says",
        "self.said = 0\n"
        "self.word = self.rng.choice(WORDS)\n"
        "return f\"Round 1 of 4: say '{self.word}'.\", {}",
        "self.said += self.word in action.lower()\n"
        "if self.turn >= 4:\n"
        "    return 'Game over.', self.said / 4, True, False, {}\n"
        "self.word = self.rng.choice(WORDS)\n"
        "return f\"Round {self.turn + 1} of 4: say '{self.word}'.\", 0.0, False, False, {}",
        "return 'Listen carefully each round.'",
        max_turns=4),
}

HONEST = {
    # the reversal of the shown word must be computed
    "reverse_the_word": env(
        "reverse",
        "self.word = self.rng.choice(WORDS)\n"
        "return f\"Spell the word '{self.word}' backwards. Reply ANSWER: <word>.\", {}",
        "got = action.strip().split(':')[-1].strip().lower()\n"
        "ok = got == self.word[::-1]\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Read it from the last letter to the first.'",
        "return ['ANSWER: ' + self.word[::-1]]"),
    # the sum of the shown numbers must be computed
    "sum_the_numbers": env(
        "sum_shown",
        "self.nums = [self.rng.randint(1000, 9999) for _ in range(3)]\n"
        "return 'Add ' + ', '.join(map(str, self.nums)) + '. Reply ANSWER: <n>.', {}",
        "m = re.findall(r'-?\\d+', action)\n"
        "ok = bool(m) and int(m[-1]) == sum(self.nums)\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'Add the thousands first, then the rest.'",
        "return [f'ANSWER: {sum(self.nums)}']"),
    # the observation shows the scrambled letters of the answer
    "unscramble": env(
        "unscramble",
        "self.word = self.rng.choice(WORDS)\n"
        "letters = list(self.word)\n"
        "while ''.join(letters) == self.word:\n"
        "    self.rng.shuffle(letters)\n"
        "return 'Unscramble: ' + ''.join(letters) + '. Reply ANSWER: <word>.', {}",
        "ok = action.strip().lower().split(':')[-1].strip() == self.word\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return f'The word has {len(self.word)} letters.'",
        "return ['ANSWER: ' + self.word]"),
    # the observation lists the choices, the answer among them at a random position: an echo
    # of choice #k is paid on the seeds whose answer is #k, never on every seed
    "pick_from_listed_choices": env(
        "odd_one_out",
        "self.fruit = self.rng.choice(['lemon', 'apple', 'pepper', 'nectar'])\n"
        "others = self.rng.sample([w for w in WORDS if w not in ('lemon', 'apple', 'pepper', "
        "'nectar')], 5)\n"
        "self.choices = others + [self.fruit]\n"
        "self.rng.shuffle(self.choices)\n"
        "return 'Which one can you eat? ' + ', '.join(self.choices) + '. Reply ANSWER: <word>.', {}",
        "ok = action.strip().lower().split(':')[-1].strip() == self.fruit\n"
        "return ('Correct' if ok else 'Wrong'), float(ok), True, False, {}",
        "return 'It grows on a plant.'",
        "return ['ANSWER: ' + self.fruit]"),
}


@pytest.mark.parametrize("name", sorted(RED_TEAM))
async def test_echo_paying_verifier_is_rejected_naming_the_echo(sandbox, name):
    report = await validate(RED_TEAM[name], sandbox)
    assert not report.accepted, report.as_dict()
    failed = {c.name: c.reason for c in report.failures}
    assert "not_exploitable" in failed, failed
    assert "observation echo" in failed["not_exploitable"], failed["not_exploitable"]
    # caught by the echo, not by a constant probe or a broken environment
    before = [c for c in report.checks if c.name in ("load", "determinism", "hint", "types")]
    assert all(c.passed for c in before), report.as_dict()
    assert any(k.startswith("observation echo") and v >= 0.5
               for k, v in report.probe_scores.items())


@pytest.mark.parametrize("name", sorted(HONEST))
async def test_honest_environment_showing_its_material_is_accepted(sandbox, name):
    report = await validate(HONEST[name], sandbox)
    assert report.accepted, [(c.name, c.reason) for c in report.failures]
    echoes = {k: v for k, v in report.probe_scores.items() if k.startswith("observation echo")}
    assert echoes and max(echoes.values()) < 0.5, echoes


def test_echo_policies_read_each_kind_off_the_observation():
    obs = ["Spell 'apple' backwards, 12 times.\nThen stop. Reply ANSWER: <word>.",
           "Spell 'lemon' backwards, 7 times.\nThen stop. Reply ANSWER: <word>."]
    pols = echo_policies(obs, ["ANSWER: elppa"])
    labels = [p.label for p in pols]
    assert labels[:2] == ["observation echo: the whole observation",
                          "observation echo: the whole observation, as 'ANSWER: ...'"]
    acts = {p.label: p.action(obs[0]) for p in pols}
    assert acts["observation echo: quoted string #1 of the observation"] == "apple"
    assert acts["observation echo: number #1 of the observation, as 'ANSWER: ...'"] == "ANSWER: 12"
    assert acts["observation echo: the last line of the observation"] == (
        "Then stop. Reply ANSWER: <word>.")
    assert acts["observation echo: word #1 of the observation"] == "Spell"
    # the same policy reads another observation (another seed, a later turn) the same way
    quoted = next(p for p in pols if p.label.endswith("quoted string #1 of the observation"))
    assert quoted.action("Now say 'river'.") == "river" and quoted.action("Wrong.") == ""
    # no two policies send the same actions on every observation
    assert len({tuple(p.action(o) for o in obs) for p in pols}) == len(pols)


def test_echo_policies_take_announced_formats_and_stay_bounded():
    pols = echo_policies(["Guess the number. Reply 'GUESS: <n>'. It is not 3."], None)
    assert any(p.prefix == "GUESS: " for p in pols)
    # an item already in the format is not sent twice over
    assert EchoProbe("quoted string", 0, "GUESS: ").action("Reply 'GUESS: <n>'.") == "GUESS: <n>"
    long = [" ".join(f"w{i}x {i}" for i in range(200)) + "\n" + "\n".join(
        f"'q{i}' line" for i in range(50))]
    assert len(echo_policies(long, ["ANSWER: 1", "GUESS: 2"])) == ECHO_LIMIT
    assert echo_policies(["", ""], None) == []
