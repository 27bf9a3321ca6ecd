"""What an engine is (``Engine``) and what one build gives it (``BuildJob``). The engines import
this module; the registry that finds them (the package's ``ENGINES``) imports the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from quantgate.config import KVCache
from quantgate.runtime.registry import mark

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet
    from quantgate.config import Recipe
    from quantgate.intake import SourceRecord
    from quantgate.runtime.progress import Progress


@dataclass(frozen=True)
class BuildJob:
    """Everything one build needs; ``out_dir`` is a temporary directory the engine fills.

    ``kv_cache``: the policy's KV cache for this build. An engine whose class sets
    ``calibrates_kv_cache = True`` writes the FP8 KV scheme and scales itself when asked; for the
    others the pipeline runs ``kv_calibration`` on what they wrote.
    """

    source: SourceRecord
    recipe: Recipe
    calibration: CalibrationSet | None
    out_dir: Path
    progress: Progress
    kv_cache: KVCache = KVCache.BF16
    device: str = "cpu"  # where calibration runs ("cpu" or "cuda")
    cache_dir: Path | None = None  # the run's cache (--cache-dir); None: $QUANTGATE_CACHE or ~/.cache
    # bytes a model calibrated whole may take on the GPU (--max-memory); None: 80 % of its free memory
    max_memory: int | None = None


class Engine(Protocol):
    """What a registered engine class provides; one instance serves one build call."""

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse, before any work, a recipe that cannot apply to this model as written."""

    def build(self, job: BuildJob) -> None:
        """Write a complete compressed-tensors checkpoint (with tokenizer) into job.out_dir."""


register = mark  # @register("name"): the engine class, found by ``quantize.engines.ENGINES``
