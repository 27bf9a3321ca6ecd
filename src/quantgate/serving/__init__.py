"""Serving: will the fleet's engine load this artifact, and at which tensor-parallel sizes?

A target's ``serving:`` contract (``targets/*.yaml``) names the engine (vLLM), the oldest
release the fleet runs and the tensor-parallel sizes it deploys. After each build,
``check.check_artifact`` reproduces the engine's load-time rules for compressed-tensors on
the artifact, from ``config.json`` and the safetensors headers alone (``rules``: one function
per rule, each citing the vLLM source it reproduces), and returns a ``ServingTable``;
``check.require_loadable`` refuses an artifact that no declared configuration can load.
The table itself is a contract (``quantgate.contracts.serving_table``: the manifest and report.json carry it) and
the releases read are ``quantgate.declarations.serving_releases`` (config validates a contract against them);
importing the package imports only the table; the check loads on use.
"""

from typing import TYPE_CHECKING

from quantgate.contracts.serving_table import Refusal, RefusedDeployment, ServingTable
from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.serving.check import require_loadable
    from quantgate.serving.layout import read_layout

__all__ = [
    "Refusal",
    "RefusedDeployment",
    "ServingTable",
    "read_layout",
    "require_loadable",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "read_layout": "layout",
        "require_loadable": "check",
    },
)
