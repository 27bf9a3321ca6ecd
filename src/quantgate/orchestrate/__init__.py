"""Orchestration: the Prefect flows that run intake, builds, evaluations, the gate and publishing.

``flow.build_and_gate`` is the pipeline; ``run.run_flow`` runs it for ``quantgate run``
(ephemeral Prefect, or the server named by ``PREFECT_API_URL``); ``flows/`` at the project root
holds the entrypoints that ``prefect.yaml`` deploys.
"""
