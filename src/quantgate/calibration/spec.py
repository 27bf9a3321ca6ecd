"""A calibration set spec: which traffic log, how many records, and in what mix.

``calibration_sets/<name>.yaml`` declares the set as data, so that the calibration a build
used can be read, reviewed and reproduced: the traffic log it samples, the size, the seed, the
share of each traffic class and of each length bucket. Length shares apply *within* each class
(``builder`` apportions them). Shares must each sum to 1 (within 1e-9); every error names the
file and line and an unknown key suggests the nearest valid one (``quantgate.config.loader``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt, ValidationInfo, field_validator

from quantgate.config import load_model
from quantgate.runtime.frozen import Frozen

SHARE_TOLERANCE = 1e-9


def _check_sum(shares: list[float], what: str) -> None:
    total = math.fsum(shares)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValueError(f"{what} shares sum to {total:.12g}, not 1; make them add up to exactly 1")


class LengthBucket(Frozen):
    """Texts of at most ``max_chars`` characters (and longer than the bucket before)."""

    name: str = Field(min_length=1)
    max_chars: PositiveInt
    share: NonNegativeFloat = Field(le=1)


class CalibrationSpec(Frozen):
    """A calibration set spec; ``traffic_log`` is relative to the spec file until loaded."""

    version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="used in the written file's name")
    description: str = ""
    traffic_log: Path = Field(description="JSONL of {id, class, text}; relative to the spec file")
    size: PositiveInt
    seed: int = 0
    mix: dict[str, NonNegativeFloat] = Field(description="traffic class -> share of the set")
    length_buckets: list[LengthBucket] = Field(min_length=1)

    @field_validator("traffic_log")
    @classmethod
    def _relative_to_spec(cls, value: Path, info: ValidationInfo) -> Path:
        base = (info.context or {}).get("base_dir")
        if base is not None and not value.is_absolute():
            return (Path(base) / value).resolve()
        return value

    @field_validator("mix")
    @classmethod
    def _mix_sums_to_one(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("mix is empty; name at least one traffic class")
        _check_sum(list(value.values()), "mix")
        return value

    @field_validator("length_buckets")
    @classmethod
    def _buckets_ordered(cls, value: list[LengthBucket]) -> list[LengthBucket]:
        _check_sum([b.share for b in value], "length_buckets")
        names = [b.name for b in value]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket names repeat ({', '.join(names)}); give each bucket its own name")
        limits = [b.max_chars for b in value]
        if limits != sorted(limits) or len(set(limits)) != len(limits):
            raise ValueError(f"max_chars must strictly increase from bucket to bucket, got {limits}")
        return value

    def bucket_of(self, text: str) -> str | None:
        """The first bucket whose ``max_chars`` holds the text; None when it is longer than all."""
        n = len(text)
        return next((b.name for b in self.length_buckets if n <= b.max_chars), None)


def load_spec(path: str | Path) -> CalibrationSpec:
    """Read a spec; ``traffic_log`` comes back absolute, resolved against the spec's folder."""
    path = Path(path)
    return load_model(path, CalibrationSpec, base_dir=path.resolve().parent)
