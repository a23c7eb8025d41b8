"""The horizon predictor (SPEC C10): instruction text → the integer number of values to forecast.

    predict_horizon("forecast the next 96 steps")                               # 96
    predict_horizon("predict the next two seconds", sampling_rate_hz=100)       # 200
    predict_horizon("what happens over the coming 3 hours?", sampling_period_s=900)  # 12

How it works: a deterministic parser, not a learned classifier. It finds the *quantity phrase* — a number in
digits ("96", "1,200", "2.5") or English words ("ninety-six", "two hundred and five", "a dozen", "half a") — followed
by a unit. Count units (steps, points, values, samples, observations, timesteps, ticks, readings) give H directly;
duration units (ms … years) are converted with the sampling rate (``H = round(duration_s · rate_hz)``), and calendar
units also match a series' own frequency ("the next 3 years" on yearly data → 3). When several quantity phrases
appear, the one after a forecast cue ("next", "coming", "following", "ahead", "future", "upcoming") wins.
``None`` when the text names no horizon. ``generate_instructions`` makes the held-out set the ≥ 99 % claim is
measured on (tests/pretrain/timeseries/test_horizon.py, benchmarks/timeseries.py).
"""

from __future__ import annotations

import random
import re

UNITS_S: dict[str, float] = {
    "millisecond": 1e-3,
    "ms": 1e-3,
    "second": 1.0,
    "sec": 1.0,
    "s": 1.0,
    "minute": 60.0,
    "min": 60.0,
    "hour": 3600.0,
    "hr": 3600.0,
    "h": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
    "month": 30.4375 * 86400.0,
    "quarter": 3 * 30.4375 * 86400.0,
    "year": 365.25 * 86400.0,
}
COUNT_UNITS = ("step", "timestep", "time step", "point", "value", "sample", "observation", "tick", "reading", "lag")
_ONES = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "a": 1, "an": 1, "single": 1,
}  # fmt: skip
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_SPECIAL = {"dozen": 12, "couple": 2, "half": 0.5, "pair": 2}
_WORDS = set(_ONES) | set(_TENS) | set(_SCALES) | set(_SPECIAL) | {"and", "of"}
CUES = ("next", "coming", "following", "ahead", "future", "upcoming", "subsequent", "further", "more")

_unit_alt = "|".join(
    sorted([re.escape(u) for u in COUNT_UNITS] + [re.escape(u) for u in UNITS_S], key=len, reverse=True)
)
_UNIT_RE = re.compile(rf"^(?:{_unit_alt})(?:e?s)?\b")
_NUM_RE = re.compile(r"^\d{1,3}(?:,\d{3})+(?:\.\d+)?|^\d+(?:\.\d+)?")


def words_to_number(words: list[str]) -> float | None:
    """English number words → value (``["two", "hundred", "and", "five"]`` → 205, ``["half", "a"]`` → 0.5)."""
    words = [w for w in words if w not in ("and", "of")]
    if words[:2] in (["a", "single"], ["an", "single"]):
        words = words[1:]
    if not words:
        return None
    if words[0] == "half":  # "half a minute", "half an hour"
        return 0.5 if len(words) == 1 or words[1:] in (["a"], ["an"]) else None
    total, current, seen = 0.0, 0.0, False
    for w in words:
        if w in _ONES:
            current += _ONES[w]
        elif w in _TENS:
            current += _TENS[w]
        elif w in ("dozen", "couple", "pair"):
            current = (current or 1) * _SPECIAL[w]
        elif w == "hundred":
            current = (current or 1) * 100
        elif w in ("thousand", "million"):
            total += (current or 1) * _SCALES[w]
            current = 0
        else:
            return None
        seen = True
    return total + current if seen else None


def _tokens(text: str) -> list[str]:
    text = text.lower().replace("-", " ")
    return re.findall(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|[a-z]+|[^\sa-z\d]", text)


def _quantities(text: str) -> list[tuple[int, float, str]]:
    """Every (token index, number, unit) phrase in ``text``."""
    toks = _tokens(text)
    out = []
    i = 0
    while i < len(toks):
        j, value = i, None
        if _NUM_RE.match(toks[i]):
            value, j = float(toks[i].replace(",", "")), i + 1
        elif toks[i] in _WORDS and toks[i] not in ("and", "of"):
            k = i
            while k < len(toks) and toks[k] in _WORDS:
                k += 1
            # Back off so the number phrase ends right before a unit ("a couple of" + "hours").
            for end in range(k, i, -1):
                v = words_to_number(toks[i:end])
                if v is not None and _unit_at(toks, end):
                    value, j = v, end
                    break
        if value is not None:
            unit = _unit_at(toks, j)
            if unit:
                out.append((i, value, unit))
                i = j + 1
                continue
        i += 1
    return out


def _unit_at(toks: list[str], j: int) -> str | None:
    if j >= len(toks):
        return None
    two = " ".join(toks[j : j + 2])
    for cand in (two, toks[j]):
        m = _UNIT_RE.match(cand)
        if m and m.end() == len(cand):
            stem = re.sub(r"(e?s)$", "", cand) if cand not in UNITS_S and cand not in COUNT_UNITS else cand
            for u in (cand, stem, cand[:-1]):
                if u in UNITS_S or u in COUNT_UNITS:
                    return u
    return None


def predict_horizon(
    instruction: str,
    sampling_rate_hz: float | None = None,
    sampling_period_s: float | None = None,
    freq_unit: str | None = None,
) -> int | None:
    """The forecast length an instruction asks for, or ``None``.

    ``sampling_rate_hz`` / ``sampling_period_s`` convert durations; ``freq_unit`` (e.g. ``"year"`` for yearly data)
    maps a duration in the series' own unit to steps when no rate is given."""
    found = _quantities(instruction)
    if not found:
        return None
    toks = _tokens(instruction)
    cued = [q for q in found if any(t in CUES for t in toks[max(0, q[0] - 3) : q[0]])]
    _, value, unit = (cued or found)[0]
    if unit in COUNT_UNITS:
        return int(round(value))
    rate = sampling_rate_hz if sampling_rate_hz else (1.0 / sampling_period_s if sampling_period_s else None)
    if rate is None and freq_unit in UNITS_S:
        rate = 1.0 / UNITS_S[freq_unit]
    if rate is None:
        return None
    return int(round(value * UNITS_S[unit] * rate))


# --- the generated held-out set ------------------------------------------------------------------------------------

_TEMPLATES = (
    "forecast the next {q}",
    "predict the next {q}.",
    "Please forecast the following {q} of this series",
    "What will the values be over the coming {q}?",
    "Give me a forecast {q} ahead",
    "extrapolate the signal for the next {q}",
    "Can you predict the upcoming {q} given the history above?",
    "Continue the series for {q}.",
    "Estimate future values: the next {q}",
    "project {q} into the future",
)


def number_words(n: int) -> str:
    """An integer in English words (``205`` → ``"two hundred and five"``, ``96`` → ``"ninety-six"``)."""
    if n < 20:
        return [k for k, v in _ONES.items() if v == n and k not in ("a", "an", "single")][0]
    if n < 100:
        tens = [k for k, v in _TENS.items() if v == n // 10 * 10][0]
        return tens + ("-" + number_words(n % 10) if n % 10 else "")
    if n < 1000:
        rest = n % 100
        return number_words(n // 100) + " hundred" + (" and " + number_words(rest) if rest else "")
    rest = n % 1000
    return (
        number_words(n // 1000) + " thousand" + ((" and " if rest < 100 else " ") + number_words(rest) if rest else "")
    )


def generate_instructions(n: int, seed: int = 0) -> list[tuple[str, dict, int]]:
    """``n`` (instruction, sampling kwargs, true horizon) triples: steps and durations, digits and words."""
    rng = random.Random(seed)
    count_units = ["steps", "time steps", "points", "values", "samples", "observations", "timesteps"]
    dur_units = [("second", 1.0), ("minute", 60.0), ("hour", 3600.0), ("day", 86400.0), ("millisecond", 1e-3)]
    out = []
    for _ in range(n):
        template = rng.choice(_TEMPLATES)
        kind = rng.random()
        as_words = rng.random() < 0.5
        if kind < 0.5:
            h = rng.choice([rng.randint(1, 30), rng.randint(1, 400), rng.randint(1, 5000)])
            num = number_words(h) if as_words else (f"{h:,}" if h >= 1000 and rng.random() < 0.5 else str(h))
            unit = count_units[rng.randrange(len(count_units))]
            if h == 1:
                unit = unit.rstrip("s") if unit != "time steps" else "time step"
            out.append((template.format(q=f"{num} {unit}"), {}, h))
            continue
        unit, unit_s = rng.choice(dur_units)
        k = rng.randint(1, 60)
        if unit == "millisecond":
            k = rng.choice([10, 20, 50, 100, 250, 500])
        if rng.random() < 0.5:  # a rate in Hz
            rate = rng.choice([1, 2, 4, 10, 25, 50, 100, 128, 250]) if unit_s <= 60 else rng.choice([1 / 60, 1 / 300])
            if unit_s >= 86400:
                rate = rng.choice([1 / 3600, 1 / 900])
            kwargs = {"sampling_rate_hz": rate}
        else:  # a period in seconds
            period = {1.0: 0.5, 60.0: 5.0, 3600.0: 60.0, 86400.0: 3600.0, 1e-3: 0.001}[unit_s]
            rate = 1.0 / period
            kwargs = {"sampling_period_s": period}
        h = int(round(k * unit_s * rate))
        if h < 1:
            continue
        num = number_words(k) if as_words else str(k)
        if k == 1 and rng.random() < 0.5:
            num = rng.choice(["one", "a", "a single"])
        phrase = f"{num} {unit}{'s' if k != 1 else ''}"
        out.append((template.format(q=phrase), kwargs, h))
    return out
