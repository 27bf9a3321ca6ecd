"""Paired comparisons with the source, item by item.

Flips (items whose pass/fail changed) are the measure that stays meaningful when both models
solve almost nothing: a recovery ratio of 0/0 is undefined, but "three items the source solved
are now wrong" is a fact.
"""

from __future__ import annotations


def flip_metrics(source: list[bool], artifact: list[bool]) -> dict[str, float]:
    """Items lost and gained against the source, and the fraction that flipped either way."""
    if len(source) != len(artifact):
        raise ValueError(f"unpaired results: {len(source)} source items, {len(artifact)} artifact items")
    lost = sum(s and not a for s, a in zip(source, artifact, strict=True))
    gained = sum(a and not s for s, a in zip(source, artifact, strict=True))
    n = len(source) or 1
    return {"flips_lost": float(lost), "flips_gained": float(gained), "flip_rate": (lost + gained) / n}
