"""Single-turn calendar arithmetic: a date some days away, or the n-th weekday after a date."""

import datetime
import random
import re

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def _resolve(specs, given):
    """The knob values of one episode: the given ones, the defaults for the rest, in range."""
    given = given if isinstance(given, dict) else {}
    out = {}
    for key, spec in specs.items():
        value = given.get(key, spec["default"])
        if spec["type"] == "int":
            value = min(spec["max"], max(spec["min"], int(value)))
        elif spec["type"] == "float":
            value = min(spec["max"], max(spec["min"], float(value)))
        elif spec["type"] == "bool":
            value = bool(value)
        elif value not in spec["choices"]:
            value = spec["default"]
        out[key] = value
    return out


def _last_date(text):
    found = re.findall(r"(?<!\d)(\d{4})-(\d{1,2})-(\d{1,2})(?!\d)", text)
    if not found:
        return None
    y, m, d = (int(v) for v in found[-1])
    try:
        return datetime.date(y, m, d)
    except ValueError:
        return None


class Environment:
    name = "date_arithmetic"
    description = (
        "A single-turn calendar question: find a date by counting days or weekdays from a given "
        "date in the Gregorian calendar (leap years included). Reply with the date in ISO form, "
        "e.g. 'ANSWER: 2021-07-04'; the last YYYY-MM-DD date in your reply is taken as the "
        "answer. You get one attempt."
    )
    max_turns = 1
    tools = []

    params = {
        "kinds": {"type": "choice", "choices": ["after", "after_before", "all"], "default": "all",
                  "description": "question kinds: days after; days after or before; also the n-th "
                                 "weekday after"},
        "max_days": {"type": "int", "min": 1, "max": 3000, "default": 3000,
                     "description": "largest day count (counts run from max_days/75; weekday "
                                    "counts up to max_days/50)"},
        "cross_month": {"type": "bool", "default": True,
                        "description": "the answer may lie in another month (off: same month, at "
                                       "most 20 days or 2 weekdays away)"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        kinds = {"after": ["after"], "after_before": ["after", "before"],
                 "all": ["after", "before", "weekday"]}[knobs["kinds"]]
        top = knobs["max_days"] if knobs["cross_month"] else min(20, knobs["max_days"])
        weeks_top = max(1, knobs["max_days"] // 50)
        if not knobs["cross_month"]:
            weeks_top = min(2, weeks_top)
        while True:
            start = datetime.date(1990, 1, 1) + datetime.timedelta(days=rng.randint(0, 14600))
            kind = rng.choice(kinds)
            self._start = start
            self._kind = kind
            if kind == "weekday":
                wd = rng.randrange(7)
                n = rng.randint(max(1, weeks_top // 12), weeks_top)
                first = start + datetime.timedelta(days=1)
                while first.weekday() != wd:
                    first += datetime.timedelta(days=1)
                self._first = first
                self._answer = first + datetime.timedelta(weeks=n - 1)
                question = (f"What is the date of the {n}{self._suffix(n)} {WEEKDAYS[wd]} "
                            f"strictly after {start.isoformat()} (a {WEEKDAYS[start.weekday()]})?")
            else:
                n = rng.randint(max(1, top // 75), top)
                sign = 1 if kind == "after" else -1
                self._answer = start + datetime.timedelta(days=sign * n)
                days = "day" if n == 1 else "days"
                question = f"What date is {n} {days} {kind} {start.isoformat()}?"
            same_month = (self._answer.year, self._answer.month) == (start.year, start.month)
            if knobs["cross_month"] or same_month:
                break
        self._n = n
        self._obs = question + " Reply 'ANSWER: YYYY-MM-DD'."
        self._turns = 0
        self._done = False
        return self._obs, {"kind": kind, "start": start.isoformat(), "knobs": knobs}

    @staticmethod
    def _suffix(n):
        if 10 <= n % 100 <= 20:
            return "th"
        return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self.max_turns
        self._done = term or trunc
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        got = _last_date(action)
        if got is None:
            return "No valid YYYY-MM-DD date found in your reply.", 0.0, False, {"correct": False}
        if got == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return f"Incorrect: {got.isoformat()} is not the date asked for.", 0.0, True, {
            "correct": False}

    def hint(self):
        a = self._answer
        if self._kind == "weekday" and self._n == 1:
            return (f"Count forward one day at a time from {self._start.isoformat()}; the "
                    f"answer is within a week of it, in {MONTHS[a.month - 1]} {a.year}.")
        if self._kind == "weekday":
            return (f"The first such weekday after the start is {self._first.isoformat()}; the "
                    f"answer is {self._n - 1} weeks later, in {MONTHS[a.month - 1]} {a.year}.")
        weeks = f"{self._n} days is {self._n // 7} weeks and {self._n % 7} days. " if (
            self._n >= 7) else ""
        return (f"{weeks}The answer is a {WEEKDAYS[a.weekday()]} in {MONTHS[a.month - 1]} "
                f"{a.year}.")

    def solution(self):
        return [f"ANSWER: {self._answer.isoformat()}"]
