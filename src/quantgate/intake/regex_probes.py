"""A tokenizer's regular expressions, run by the engine that will run them, on text built to make
them backtrack.

tokenizer.json carries Oniguruma regexes (pre-tokenizer ``Split``, normalizer and decoder
``Replace``) that the Rust tokenizer applies to every text. One that backtracks catastrophically,
``(\\w+\\s?)*$`` say, makes Oniguruma stop at its retry limit after about a second per match, and
the tokenizer panics: the build died in KV calibration with a Rust backtrace. So each regex is
compiled and run here, through ``tokenizers``' own ``Split`` (the same engine and flags), on
probes that drive backtracking: long runs of one character class (letters, digits, spaces, line
breaks, punctuation, CJK, emoji...) each ended by a character of another class, which makes a
nested or overlapping quantifier try every split of the run before failing, and ordinary
sentences. A panic, or an error, refuses the tokenizer; a regex that is merely slow on them is
stopped by the CPU limit of the child these probes run in (``tokenizer_files``).

Why probing rather than refusing regex features: the regexes of real tokenizers use lookahead,
Unicode classes and case-insensitive groups that a second regex dialect would have to parse
exactly as Oniguruma does, and star height alone both refuses patterns Oniguruma runs in linear
time and misses ambiguous alternations. Probing asks the engine itself. Its limit: a regex whose
blow-up needs text unlike every probe passes (RELIABILITY.md, known limits).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

RUN = 256  # characters per run: 2**256 splits for a nested quantifier, milliseconds for a sound regex
# one character of each class a tokenizer regex distinguishes
CLASSES = ("a", "Z", "é", "中", "7", "٣", " ", "\t", "\n", "\r\n", "!", "'", "_", "-", "😀", "\u200b")
_SENTENCES = (
    "The quick brown fox jumps over the lazy dog. " * 8,
    "def add(a, b):\n    return a + b\n" * 4,
    "Question: what is 12 plus 30? Answer: 42.\n" * 4,
)


def _probes() -> tuple[str, ...]:
    runs = tuple(c * RUN + end for c in CLASSES for end in ("", "\x00", *CLASSES) if end != c)
    mixed = tuple(pair * (RUN // 2) + "\x00" for pair in ("a ", "a1", "ab", " \n", "a'"))
    return (*_SENTENCES, *runs, *mixed)


PROBES = _probes()


def patterns(tokenizer: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, pattern) for every ``{"Regex": pattern}`` of a parsed tokenizer.json, outside its
    vocabulary (``model``) and added tokens; ``where`` names the component (``pre_tokenizer``)."""
    stack: list[tuple[str, Any]] = [
        (key, value) for key, value in tokenizer.items() if key not in ("model", "added_tokens")
    ]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            regex = value.get("Regex")
            if isinstance(regex, str):
                yield where, regex
            stack.extend((where, v) for k, v in value.items() if k != "Regex")
        elif isinstance(value, list):
            stack.extend((where, v) for v in value)


def check(pattern: str) -> str | None:
    """None when ``pattern`` compiles and runs through every probe, else what went wrong."""
    from tokenizers import Regex, pre_tokenizers

    try:
        split = pre_tokenizers.Split(Regex(pattern), "isolated")
    except Exception as exc:  # noqa: BLE001  Oniguruma's own syntax error
        return f"does not compile ({' '.join(str(exc).split())[:160]})"
    for probe in PROBES:
        try:
            split.pre_tokenize_str(probe)
        except BaseException as exc:  # noqa: BLE001  the panic at the retry limit is a BaseException
            kind = "ordinary text" if probe in _SENTENCES else f"a run of {probe[0]!r} ended by {probe[-1]!r}"
            return (
                f"fails on {kind} ({' '.join(str(exc).split())[:160]}): it backtracks without end, and "
                "the tokenizer would panic on such text"
            )
    return None
