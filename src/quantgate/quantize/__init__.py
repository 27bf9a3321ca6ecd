"""Quantize: one artifact per target from one source checkpoint.

``pipeline`` orders the work (preflight every recipe first, reuse by build key, build twins
once, install atomically); ``engines/`` holds one module per engine, found by name; ``preflight``
refuses a recipe that cannot apply to the model before anything is loaded.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.quantize.kv_calibration import kv_decisions
    from quantgate.quantize.pipeline import PlannedBuild, build_planned, plan

__all__ = [
    "PlannedBuild",
    "build_planned",
    "kv_decisions",
    "plan",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "PlannedBuild": "pipeline",
        "build_planned": "pipeline",
        "kv_decisions": "kv_calibration",
        "plan": "pipeline",
    },
)
