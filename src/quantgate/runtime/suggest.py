"""The one way every refusal of an unknown name suggests the nearest valid one ("did you mean").

A typo in a target, tenant, suite, engine or YAML key deserves the same answer everywhere, so
the matching rule and the wording live here once.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The closest valid name to a typo, or None when nothing is close."""
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def did_you_mean(name: str, choices: Iterable[str], *, known: str = "known") -> str:
    """The fix for an unknown name: "did you mean 'x'? known: a, b" (the hint only when close)."""
    options = sorted(set(choices))
    hint = nearest(name, options)
    listing = f"{known}: {', '.join(options) if options else 'none yet'}"
    return (f"did you mean '{hint}'? " if hint else "") + listing
