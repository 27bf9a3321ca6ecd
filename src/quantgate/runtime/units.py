"""Byte units, SI everywhere: kB = 1000 B, MB = 1000 kB, GB = 1000 MB.

One convention for every size quantgate prints or reads from config (reports, build tables,
cache limits, transfer chunk sizes), so that "MB" never means two things. Memory limits and
disk sizes alike are SI; where an operating-system interface needs a power of two (a page,
a kernel readahead window) the code says so with ``* 1024`` at that spot.
"""

from __future__ import annotations

import math
import re

KB = 1000
MB = 1000 * KB
GB = 1000 * MB
TB = 1000 * GB

_STEPS = (("B", 1), ("kB", KB), ("MB", MB), ("GB", GB), ("TB", TB))


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest SI unit not above it: '512 B', '166.8 MB', '3.1 GB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    unit, size = next(((u, s) for u, s in reversed(_STEPS) if n >= s), _STEPS[0])
    return f"{sign}{n:.0f} B" if unit == "B" else f"{sign}{n / size:.1f} {unit}"


_READ = {
    "b": 1,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


MAX_SIZE = 1000 * TB * 1000  # an exabyte: no memory or disk quantgate sizes comes near it


def parse_bytes(text: str) -> int:
    """'40GB', '512 MB', '1.5TB' (SI, as printed) or '40GiB' (binary, as GPU tools print memory) as
    bytes; ``ValueError`` naming the accepted forms for anything else (a bare number is refused: its
    unit would be a guess), and for a size past ``MAX_SIZE`` (a 400-digit number was an
    ``OverflowError`` traceback: float('9' * 400) is infinite)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]+)\s*", text)
    unit = _READ.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text):,} characters)"
        raise ValueError(f"{shown!r} is not a size: write a number and a unit, e.g. 40GB, 512MB or 40GiB")
    number = match.group(1)
    value = float(number) * unit if len(number) <= 40 else math.inf
    if not value <= MAX_SIZE:
        shown = number if len(number) <= 40 else f"a number of {len(number):,} digits"
        raise ValueError(f"{shown} {match.group(2)} is past the largest size taken (1000 PB)")
    return int(value)
