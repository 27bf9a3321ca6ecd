"""Serving: will the fleet's engine load this artifact, and at which tensor-parallel sizes?

A target's ``serving:`` contract (``targets/*.yaml``) names the engine (vLLM), the oldest
release the fleet runs and the tensor-parallel sizes it deploys. After each build,
``check.check_artifact`` reproduces the engine's load-time rules for compressed-tensors on
the artifact, from ``config.json`` and the safetensors headers alone (``rules``: one function
per rule, each citing the vLLM source it reproduces), and returns a ``ServingTable``;
``check.require_loadable`` refuses an artifact that no declared configuration can load.
Importing the package imports only ``table`` (plain pydantic data); the check loads on use.
"""

from quantgate.serving.table import Refusal, RefusedDeployment, ServingTable

__all__ = ["Refusal", "RefusedDeployment", "ServingTable"]
