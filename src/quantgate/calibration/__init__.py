"""Calibration data: sets sampled from a traffic log to mirror the production mix.

A spec (``calibration_sets/<name>.yaml``) names a traffic log and declares the set's size, seed,
share per traffic class and share per length bucket; ``build_set`` samples it deterministically,
``write_set`` writes it as ``<name>-<sha12>.jsonl`` and ``load_or_build`` reuses a written set
while the spec and the log are unchanged. The set's sha256 (over its canonical JSONL) is its
identity, recorded with every artifact calibrated on it.
"""

from quantgate.calibration.builder import (
    CalibrationRecord,
    CalibrationSet,
    build_set,
    cache_key,
    largest_remainder,
    load_or_build,
    read_traffic_log,
    write_set,
)
from quantgate.calibration.spec import CalibrationSpec, LengthBucket, load_spec

__all__ = [
    "CalibrationRecord",
    "CalibrationSet",
    "CalibrationSpec",
    "LengthBucket",
    "build_set",
    "cache_key",
    "largest_remainder",
    "load_or_build",
    "load_spec",
    "read_traffic_log",
    "write_set",
]
