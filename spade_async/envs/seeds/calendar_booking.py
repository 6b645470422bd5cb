"""Multi-turn tool use on a booking API: move a meeting to the earliest free slot after a time."""

import json
import random
import re

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
HOURS = list(range(9, 17))
TITLES = ["Budget review", "Design critique", "Vendor call", "1:1 with Sam", "Hiring panel",
          "Roadmap sync", "Security audit", "Customer demo", "Retro", "Lunch and learn",
          "Infra standup", "Board prep", "Sales pipeline", "Offsite planning", "QA triage"]
TOOLS = [
    {"type": "function", "function": {
        "name": "list_slots",
        "description": "List the hourly slots of a day (09:00 to 16:00) with their bookings.",
        "parameters": {"type": "object", "properties": {"day": {"type": "string", "enum": DAYS}},
                       "required": ["day"]}}},
    {"type": "function", "function": {
        "name": "book", "description": "Book a free slot; returns the new booking id.",
        "parameters": {"type": "object", "properties": {
            "day": {"type": "string", "enum": DAYS},
            "time": {"type": "string", "description": "start time as HH:00, e.g. 14:00"},
            "title": {"type": "string"}}, "required": ["day", "time", "title"]}}},
    {"type": "function", "function": {
        "name": "cancel", "description": "Cancel a booking by its id.",
        "parameters": {"type": "object", "properties": {"booking_id": {"type": "string"}},
                       "required": ["booking_id"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Declare the task done; the calendar is then checked.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]


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


def _template(tool, **placeholders):
    """A call's JSON form with <placeholders> for its arguments, as a task may show it."""
    return json.dumps({"tool": tool, "arguments": {k: f"<{v}>" for k, v in placeholders.items()}})


def _call(tool, **arguments):
    return json.dumps({"tool": tool, "arguments": arguments})


def _parse_call(action):
    try:
        obj = json.loads(action)
    except Exception:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return None, None
    args = obj.get("arguments", {})
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except Exception:
            return obj["tool"], None
    return obj["tool"], args if isinstance(args, dict) else None


def _day(value):
    if not isinstance(value, str):
        return None
    value = value.strip().capitalize()
    return value if value in DAYS else None


def _hour(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value in HOURS else None
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*(\d{1,2})(:00)?\s*", value)  # "14:00" or "14"; not "14:30"
    if m is None:
        return None
    h = int(m.group(1))
    return h if h in HOURS else None


class Environment:
    name = "calendar_booking"
    description = (
        "Multi-turn tool use on a calendar booking API for one work week (Monday to Friday, "
        "one-hour slots starting 09:00 to 16:00). Move the named meeting as instructed: cancel "
        "its current booking (when the task says it has one) and book, under exactly the same "
        "title, the earliest free slot on the target day that starts at or after the given "
        "time. Leave every other booking as it is, then call submit (unless the task says the "
        "booking itself is checked). Tools: list_slots(day), book(day, time, title), "
        "cancel(booking_id), submit(). Each reply must be one JSON tool call exactly like "
        "{\"tool\": \"list_slots\", \"arguments\": {\"day\": \"Monday\"}}. Submitting ends the "
        "episode and pays 1 only if the calendar is exactly right."
    )
    max_turns = 10
    tools = TOOLS

    params = {
        "move": {"type": "bool", "default": True,
                 "description": "the meeting is already booked and must be cancelled (off: a new "
                                "booking only)"},
        "blocked": {"type": "int", "min": 0, "max": 2, "default": 2,
                    "description": "most booked slots between the asked time and the free one"},
        "busy": {"type": "float", "min": 0.0, "max": 0.5, "default": 0.3,
                 "description": "share of the week's other slots that are booked"},
        "submit": {"type": "bool", "default": True,
                   "description": "finish with submit (off: the first successful booking is "
                                  "checked at once and ends the episode)"},
        "show_format": {"type": "bool", "default": False, "easy": True,
                        "description": "the task shows the JSON form of each call it needs, "
                                       "with <placeholders> to fill in"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        titles = rng.sample(TITLES, len(TITLES))
        self._title = titles[0]
        src, dst = rng.sample(DAYS, 2)
        after = rng.choice([10, 11, 12, 13, 14])
        target = rng.randint(after, min(after + knobs["blocked"], 16))
        slots = [(d, h) for d in DAYS for h in HOURS]
        self._bookings = {}
        used = set()
        ids = rng.sample(range(100, 1000), 30)

        def add(day, hour, title):
            bid = f"bk{ids[len(self._bookings)]}"
            self._bookings[bid] = [day, hour, title]
            used.add((day, hour))
            return bid

        old_hour = rng.choice(HOURS)
        self._old_id = add(src, old_hour, self._title) if knobs["move"] else None
        for h in range(after, target):
            add(dst, h, titles[1 + len(self._bookings) % 14])
        for d, h in slots:
            if (d, h) in used or (d == dst and h == target):
                continue
            if rng.random() < knobs["busy"] and len(self._bookings) < 22:
                add(d, h, titles[1 + len(self._bookings) % 14])
        order = sorted(self._bookings, key=lambda b: (DAYS.index(self._bookings[b][0]),
                                                       self._bookings[b][1]))
        self._bookings = {b: self._bookings[b] for b in order}
        self._others = {b: list(v) for b, v in self._bookings.items() if b != self._old_id}
        self._src, self._dst, self._after, self._target = src, dst, after, target
        self._need_submit = knobs["submit"]
        self._next_id = 1000
        self._turns = 0
        self._done = False
        if knobs["move"]:
            obs = (f"Task: move '{self._title}' (currently on {src}) to the earliest free slot "
                   f"on {dst} starting at or after {after}:00.")
        else:
            obs = (f"Task: book '{self._title}' in the earliest free slot on {dst} starting at "
                   f"or after {after}:00.")
        if not self._need_submit:
            obs += " Your first successful booking is checked at once and ends the episode."
        obs += " Reply with one JSON tool call per turn."
        if knobs["show_format"]:
            calls = ([_template("list_slots", day="day"), _template("cancel", booking_id="id")]
                     if knobs["move"] else [])
            calls.append(_template("book", day="day", time="HH:00", title="title"))
            calls += [_call("submit")] if self._need_submit else []
            obs += " The calls you need look like: " + " ".join(calls)
        return obs, {"title": self._title, "from": src if knobs["move"] else None, "to": dst,
                     "after": f"{after}:00", "knobs": knobs}

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
        if trunc:
            obs += " Out of turns; the episode is over without a submit."
        return obs, float(reward), term, trunc, info

    def _find(self, day, hour):
        for bid, (d, h, _) in self._bookings.items():
            if d == day and h == hour:
                return bid
        return None

    def _act(self, action):
        tool, args = _parse_call(action)
        if tool is None:
            return ("Not a tool call. Reply with JSON like {\"tool\": \"list_slots\", "
                    "\"arguments\": {\"day\": \"Monday\"}}.", 0.0, False, {"error": "not_a_tool_call"})
        if args is None:
            return "The arguments must be a JSON object.", 0.0, False, {"error": "bad_arguments"}
        if tool not in ("list_slots", "book", "cancel", "submit"):
            return (f"Unknown tool {tool[:40]!r}; use list_slots, book, cancel or submit.", 0.0,
                    False, {"error": "unknown_tool"})
        if tool == "submit":
            return self._submit()
        if tool == "cancel":
            bid = args.get("booking_id")
            if not isinstance(bid, str) or bid.strip() not in self._bookings:
                return "cancel: no booking with that id.", 0.0, False, {"tool": "cancel"}
            del self._bookings[bid.strip()]
            return json.dumps({"cancelled": bid.strip()}), 0.0, False, {"tool": "cancel"}
        day = _day(args.get("day"))
        if day is None:
            return f"{tool} needs 'day', one of {', '.join(DAYS)}.", 0.0, False, {
                "error": "bad_arguments"}
        if tool == "list_slots":
            rows = []
            for h in HOURS:
                bid = self._find(day, h)
                row = {"time": f"{h:02d}:00", "status": "free" if bid is None else "booked"}
                if bid is not None:
                    row["booking_id"], row["title"] = bid, self._bookings[bid][2]
                rows.append(row)
            return json.dumps({"day": day, "slots": rows}), 0.0, False, {"tool": "list_slots"}
        hour = _hour(args.get("time"))
        title = args.get("title")
        if hour is None or not isinstance(title, str) or not title.strip():
            return "book needs 'time' (HH:00, 09:00 to 16:00) and a non-empty 'title'.", 0.0, \
                False, {"error": "bad_arguments"}
        if self._find(day, hour) is not None:
            return f"book: {day} {hour:02d}:00 is already booked.", 0.0, False, {"tool": "book"}
        if len(self._bookings) >= 40:
            return "book: the calendar is full.", 0.0, False, {"tool": "book"}
        bid = f"bk{self._next_id}"
        self._next_id += 1
        self._bookings[bid] = [day, hour, title.strip()[:80]]
        booked = json.dumps({"booked": bid, "day": day, "time": f"{hour:02d}:00"})
        if not self._need_submit:
            obs, reward, term, info = self._submit()
            return booked + " " + obs, reward, term, info
        return booked, 0.0, False, {"tool": "book"}

    def _submit(self):
        mine = [v for v in self._bookings.values() if v[2] == self._title]
        others = {b: v for b, v in self._bookings.items() if v[2] != self._title}
        problems = []
        if len(mine) != 1 or mine[0][:2] != [self._dst, self._target]:
            problems.append(f"'{self._title}' is not booked exactly once in the right slot")
        if others != self._others:
            problems.append("other bookings were changed")
        if problems:
            return "Submitted, but " + "; ".join(problems) + ".", 0.0, True, {"success": False}
        return "Submitted: the meeting was moved correctly.", 1.0, True, {"success": True}

    def hint(self):
        slot = (f"the earliest free slot on {self._dst} at or after {self._after}:00 is "
                f"{self._target:02d}:00.")
        if self._old_id is None:
            return slot[0].upper() + slot[1:]
        return f"The current booking is {self._old_id}; {slot}"

    def solution(self):
        moves = []
        if self._old_id is not None:
            moves += [_call("list_slots", day=self._src),
                      _call("cancel", booking_id=self._old_id)]
        moves += [_call("list_slots", day=self._dst),
                  _call("book", day=self._dst, time=f"{self._target:02d}:00", title=self._title)]
        return moves + ([_call("submit")] if self._need_submit else [])
