"""quantgate: per-hardware quantized artifacts from one checkpoint, each behind a quality gate."""

__version__ = "0.2.0"
