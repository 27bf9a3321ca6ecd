"""Auto-repair: a target that failed a tenant's floors searches for the smallest mixed-precision
variant of itself that passes them.

``units`` names the layer groups a uniform artifact quantizes (a fused vLLM layer is one group:
its shards must share a scheme to load); ``sensitivity`` measures how much of the artifact's
divergence from the source each group causes, once per (source, artifact, calibration); ``variants``
writes the recipe that keeps the k most sensitive groups at the target's next precision up, as one
compressed-tensors checkpoint; ``search`` bisects on k against the gate within a budget; ``run``
ties them to builds, evaluations and the gate and writes ``repair.json``.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.repair.run import RepairInputs, RepairOutcome, repair

__all__ = [
    "RepairInputs",
    "RepairOutcome",
    "repair",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "RepairInputs": "run",
        "RepairOutcome": "run",
        "repair": "run",
    },
)
