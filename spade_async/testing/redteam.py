"""Environment modules for the red-team suites (tests/test_hint_leak.py,
tests/test_echo_probes.py): a class from method bodies, with word and name lists to draw from."""

from __future__ import annotations


def env(name: str, reset: str, step: str, hint: str, solution: str | None = None,
        max_turns: int = 1, tools: str = "[]", extra: str = "") -> str:
    """An environment module from method bodies (each indented by 8 spaces in the class)."""

    def body(code: str) -> str:
        return "\n".join("        " + line for line in code.strip("\n").splitlines())

    sol = f"\n    def solution(self):\n{body(solution)}\n" if solution else ""
    return f'''
import json
import random
import re

WORDS = ["apple", "brick", "cloud", "dune", "ember", "frost", "grove", "harbor", "ivory",
         "jungle", "kettle", "lemon", "marble", "nectar", "orbit", "pepper", "quartz", "river",
         "saddle", "timber", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr"]
NAMES = ["Marta", "Jonas", "Priya", "Tomasz", "Keiko", "Olu", "Ines", "Rafael", "Sven", "Lucia"]
{extra}

class Environment:
    name = "{name}"
    description = "A task written for the red-team suite."
    max_turns = {max_turns}
    tools = {tools}

    def reset(self, seed):
        self.rng = random.Random(seed)
        self.turn = 0
{body(reset)}

    def step(self, action):
        self.turn += 1
{body(step)}

    def hint(self):
{body(hint)}
{sol}'''
