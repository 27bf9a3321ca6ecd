"""Deployment entrypoint (``prefect.yaml``, ``canary-watch``): the flow lives in
``quantgate.orchestrate.canary``. Scheduled every few minutes per (model, target, tenant); each
run is one look, and a run killed anywhere is completed by the next."""

from quantgate.orchestrate.canary import canary_watch

__all__ = ["canary_watch"]
