"""quantgate: per-hardware quantized artifacts from one checkpoint, each behind a quality gate."""

__version__ = "0.1.0"
