"""Answers a hint gives in another form, read off by rule (DESIGN §3b; issue: hints that leak
the answer spelled out, reversed, split, as arithmetic still to do, or in another notation).

`decoded_answers(hint, observation)` returns (how it was read, the value) for each:
- number words as digits: "forty-two" -> 42, "three hundred and five" -> 305, and a run of
  digit words read digit by digit: "four two" -> 42;
- reversal: each word and number of the hint reversed, and the whole hint;
- pieces joined: runs of single characters ("h-e-l-l-o", "4 2"), the quoted strings in order,
  the numbers in order;
- another notation: hexadecimal, binary and octal literals, Roman numerals, "<digits> in base N";
- arithmetic still to do, where the hint says it: "3 less than 50", "half of 84", "twice 21",
  "50 minus 3", "6 * 7", where at least one operand is not in the observation. A hint that
  restates the task's own operands with a method ("multiply 12 by 34") gives the method, not
  the answer: its arithmetic is left out. Arithmetic the hint does not spell out (any pair of
  its numbers) is not tried: a hint with the state one step before the end (trace_program's)
  narrows the task that way honestly.

None of these is a model's reading: they catch the common forms cheaply, before the model
check of `hint_reader.py`, which is what generalises.
"""

from __future__ import annotations

import re

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate(
    "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NEGATIVE = {"minus", "negative"}
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\d)")
_INT = re.compile(r"(?<![\w.])-?\d+(?!\w|\.\d)")
_QUOTED = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
_TOKEN = re.compile(r"[A-Za-z0-9_]+")
_SINGLES = re.compile(r"(?<![A-Za-z0-9])([A-Za-z0-9])(?:[\s,.;:\-_/|+]+([A-Za-z0-9])"
                      r"(?![A-Za-z0-9]))+")
_ROMAN = re.compile(r"\b(M{0,4}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3}))\b")
_ROMAN_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
_BASE = re.compile(r"\b([0-9a-fA-F]+)\s*(?:\(|,)?\s*(?:in\s+)?base[\s-]*(\d{1,2})\b", re.I)
_LITERAL = re.compile(r"\b0([xob])([0-9a-fA-F_]+)\b", re.I)

# "A less than B" -> B - A, ... (operands are numbers after words became digits)
_N = r"(-?\d+(?:\.\d+)?)"
_PHRASES: tuple[tuple[re.Pattern[str], str, object], ...] = tuple(
    (re.compile(p, re.I), what, fn) for p, what, fn in (
        (rf"{_N}\s+(?:less|fewer|smaller|lower)\s+than\s+{_N}", "{a} less than {b}",
         lambda a, b: b - a),
        (rf"{_N}\s+(?:more|greater|larger|higher|bigger)\s+than\s+{_N}", "{a} more than {b}",
         lambda a, b: b + a),
        (rf"{_N}\s*(?:minus|-|−)\s*{_N}", "{a} minus {b}", lambda a, b: a - b),
        (rf"{_N}\s*(?:plus|\+)\s*{_N}", "{a} plus {b}", lambda a, b: a + b),
        (rf"{_N}\s*(?:times|multiplied by|\*|×|\sx\s)\s*{_N}", "{a} times {b}",
         lambda a, b: a * b),
        (rf"{_N}\s*(?:divided by|over|/|÷)\s*{_N}", "{a} divided by {b}",
         lambda a, b: a / b if b else None),
        (rf"(?:subtract|take away)\s+{_N}\s+from\s+{_N}", "{b} minus {a}", lambda a, b: b - a),
        (rf"add\s+{_N}\s+(?:to|and)\s+{_N}", "{a} plus {b}", lambda a, b: a + b),
        (rf"(?:the )?(?:sum|total) of\s+{_N}\s+and\s+{_N}", "{a} plus {b}",
         lambda a, b: a + b),
        (rf"(?:the )?difference (?:of|between)\s+{_N}\s+and\s+{_N}", "{a} minus {b}",
         lambda a, b: a - b),
        (rf"(?:the )?product of\s+{_N}\s+and\s+{_N}", "{a} times {b}", lambda a, b: a * b),
    ))
_UNARY: tuple[tuple[re.Pattern[str], str, object], ...] = tuple(
    (re.compile(p, re.I), what, fn) for p, what, fn in (
        (rf"half (?:of )?{_N}", "half of {a}", lambda a: a / 2),
        (rf"(?:a )?third of {_N}", "a third of {a}", lambda a: a / 3),
        (rf"(?:a )?quarter of {_N}", "a quarter of {a}", lambda a: a / 4),
        (rf"(?:twice|double)\s+(?:of\s+)?{_N}", "twice {a}", lambda a: 2 * a),
        (rf"{_N}\s+doubled", "twice {a}", lambda a: 2 * a),
        (rf"(?:triple|thrice|three times)\s+{_N}", "three times {a}", lambda a: 3 * a),
        (rf"{_N}\s+squared|(?:the )?square of {_N}", "{a} squared", lambda a: a * a),
        (rf"(?:the )?square root of {_N}", "the square root of {a}",
         lambda a: a ** 0.5 if a >= 0 else None),
        (rf"one (?:more|greater) than {_N}", "one more than {a}", lambda a: a + 1),
        (rf"one (?:less|fewer|smaller) than {_N}", "one less than {a}", lambda a: a - 1),
        (rf"(?:the )?negative of {_N}|{_N}\s+negated", "the negative of {a}", lambda a: -a),
    ))

MAX_DECODED = 32  # per hint: bounds the policies validation plays


def _num(text: str) -> float:
    return float(text) if "." in text else int(text)


def _fmt(x: float | int | None) -> str | None:
    """A computed value as an answer would spell it; None when it is not a clean number."""
    if x is None or isinstance(x, complex):
        return None
    if isinstance(x, float):
        if x != x or abs(x) > 1e15:
            return None
        if x.is_integer():
            return str(int(x))
        return f"{x:.6g}" if len(f"{x:.6g}") < len(repr(x)) else None
    return str(x)


def words_to_numbers(text: str) -> tuple[str, list[tuple[str, str]]]:
    """`text` with each run of number words replaced by its digits, and (words, digits) for
    each run replaced; a run of two or more digit words ("four two") also reads digit by digit,
    returned as an extra (words, digits) pair."""
    tokens = re.split(r"(\s+|-)", text)
    out: list[str] = []
    runs: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        if tokens[i].strip() in ("", "-"):
            out.append(tokens[i])
            i += 1
            continue
        j, words = i, []
        while j < len(tokens):
            t = tokens[j].strip(".,;:!?()").lower()
            if tokens[j].strip() in ("", "-") or t == "and" and words:
                j += 1
                continue
            if t in _UNITS or t in _TENS or t in _SCALES or (t in _NEGATIVE and not words):
                words.append((j, t))
                j += 1
                continue
            break
        while words and words[-1][1] in _NEGATIVE:
            words.pop()
        if not words or all(w in _NEGATIVE for _, w in words):
            out.append(tokens[i])
            i += 1
            continue
        end = words[-1][0] + 1
        seq = [w for _, w in words]
        value = _words_value(seq)
        spelled = "".join(tokens[i:end])
        trail = re.search(r"[.,;:!?()]+$", tokens[end - 1])
        if value is not None:
            out.append(str(value) + (trail.group() if trail else ""))
            runs.append((spelled.strip(), str(value)))
        else:
            out.append(spelled)
        digits = [w for w in seq if w not in _NEGATIVE]
        if len(digits) > 1 and all(w in _UNITS and _UNITS[w] < 10 for w in digits):
            runs.append((spelled.strip(), ("-" if seq[0] in _NEGATIVE else "")
                         + "".join(str(_UNITS[w]) for w in digits)))
        i = end
    return "".join(out), runs


def _words_value(seq: list[str]) -> int | None:
    """The value of number words in order ("three hundred five"); None when they do not read
    as one number (e.g. "five five": digits, handled by the caller)."""
    sign = -1 if seq and seq[0] in _NEGATIVE else 1
    seq = [w for w in seq if w not in _NEGATIVE]
    total = current = 0
    last = None  # the kind of the last word: unit, teen, tens, scale
    for w in seq:
        if w in _SCALES:
            if last is None:
                current = 1
            scale = _SCALES[w]
            if scale == 100:
                current *= 100
            else:
                total += current * scale
                current = 0
            last = "scale"
        elif w in _TENS:
            if last in ("unit", "teen", "tens"):
                return None
            current += _TENS[w]
            last = "tens"
        else:
            v = _UNITS[w]
            if last in ("unit", "teen") or (last == "tens" and v >= 10):
                return None
            current += v
            last = "teen" if v >= 10 else "unit"
    return sign * (total + current)


def _roman(text: str) -> int | None:
    if not text or not re.fullmatch(r"[MDCLXVI]+", text):
        return None
    total = 0
    for a, b in zip(text, text[1:] + " ", strict=True):
        v = _ROMAN_VALUES[a]
        total += -v if b != " " and _ROMAN_VALUES[b] > v else v
    return total


def decoded_answers(hint: str, observation: str = "") -> list[tuple[str, str]]:
    """(how it was read, value) for each answer the hint gives in another form (module
    docstring), most specific first, at most MAX_DECODED, none equal to text already in the
    hint as it stands (the verbatim policies play those)."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    verbatim = {t.lower() for t in _TOKEN.findall(hint)}

    def add(what: str, value: str | None) -> None:
        if value is None:
            return
        value = value.strip()
        key = value.lower()
        if not value or key in seen or key in verbatim:
            return
        seen.add(key)
        out.append((what, value))

    text, runs = words_to_numbers(hint)
    for words, digits in runs:
        add(f"the number words {words!r} as digits", digits)
    # another notation
    for m in _LITERAL.finditer(hint):
        base = {"x": 16, "o": 8, "b": 2}[m.group(1).lower()]
        try:
            add(f"{m.group(0)} in base 10", str(int(m.group(2).replace("_", ""), base)))
        except ValueError:
            pass
    for m in _BASE.finditer(hint):
        base = int(m.group(2))
        if 2 <= base <= 36:
            try:
                add(f"{m.group(1)} in base {base}, in base 10", str(int(m.group(1), base)))
            except ValueError:
                pass
    for m in _ROMAN.finditer(hint):
        if len(m.group(1)) >= 2 or m.group(1) in ("V", "X", "L", "C", "D", "M"):
            add(f"the Roman numeral {m.group(1)}", _fmt(_roman(m.group(1))))
    # arithmetic still to do
    obs_numbers = {_fmt(_num(n)) for n in _NUMBER.findall(words_to_numbers(observation)[0])}

    def new_info(*xs: float) -> bool:
        return any(_fmt(x) not in obs_numbers for x in xs)

    for pat, what, fn in _PHRASES:
        for m in pat.finditer(text):
            a, b = _num(m.group(1)), _num(m.group(2))
            if new_info(a, b):
                add(what.format(a=m.group(1), b=m.group(2)), _fmt(fn(a, b)))
    for pat, what, fn in _UNARY:
        for m in pat.finditer(text):
            g = next(x for x in m.groups() if x is not None)
            if new_info(_num(g)):
                add(what.format(a=g), _fmt(fn(_num(g))))
    # pieces joined
    for m in _SINGLES.finditer(hint):
        add(f"the pieces {m.group(0)!r} joined", "".join(re.findall(r"[A-Za-z0-9]", m.group(0))))
    quoted = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(hint)]
    if len(quoted) > 1:
        add("the quoted strings joined in order", "".join(q.strip() for q in quoted))
    numbers = _INT.findall(text)
    if 1 < len(numbers) <= 6:
        add("the numbers joined in order", "".join(n.lstrip("-") for n in numbers))
    # reversal (numbers of two or more digits, words of three or more letters, the first few)
    tokens = [t for t in dict.fromkeys(_TOKEN.findall(text))
              if (len(t) > 2 or t.isdigit() and len(t) > 1) and t[::-1] != t]
    for tok in tokens[:12]:
        add(f"{tok!r} reversed", tok[::-1])
    for q in quoted:
        add(f"the quoted {q!r} reversed", q.strip()[::-1])
    if len(hint.strip()) <= 80:
        add("the whole hint reversed", hint.strip()[::-1])
    return out[:MAX_DECODED]
