"""Tell the fleet that an alias moved: a Prefect event, best effort.

``quantgate.alias.moved`` is emitted whenever publish points an ``approved-<tenant>`` alias at
a different version (or removes it: ``version`` is null). A Prefect automation can trigger a
fleet roll-out from it. It is emitted only where Prefect is already in play (inside a flow
run, or with ``PREFECT_API_URL`` set): importing Prefect, or starting its ephemeral server,
just to shout into the void would cost seconds per publish. A failure to emit never fails a
publish: the registry is the source of truth, and MLflow's own webhooks
(``model_version_alias.created`` / ``.deleted``) say the same thing from the server side.
"""

from __future__ import annotations

import logging
import os
import sys

from quantgate.publish.config import RegistryConfig

EVENT = "quantgate.alias.moved"
log = logging.getLogger(__name__)


def payload(
    cfg: RegistryConfig, name: str, alias: str, version: str | None, previous: str | None, content_hash: str
) -> dict[str, str | None]:
    """The event's payload: which alias of which registered model moved, from where to where."""
    return {
        "tracking_uri": cfg.tracking_uri,
        "registered_model": name,
        "alias": alias,
        "version": version,
        "previous_version": previous,
        "content_hash": content_hash,
    }


def _prefect_in_play() -> bool:
    """Inside a flow or task run, or with a server this process's Prefect settings name.

    Once Prefect is imported its settings are what it will use, not the environment as it is
    now: a ``PREFECT_API_URL`` set after the import would be ignored by ``emit_event``, which
    would then start a temporary server (seconds) to deliver one event. So the environment is
    asked only while Prefect is not imported yet, and Prefect's own settings after."""
    if "prefect" not in sys.modules:
        return bool(os.environ.get("PREFECT_API_URL"))
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import get_current_settings

    if FlowRunContext.get() is not None or TaskRunContext.get() is not None:
        return True
    return bool(get_current_settings().api.url)


def alias_moved(
    cfg: RegistryConfig, name: str, alias: str, version: str | None, previous: str | None, content_hash: str
) -> bool:
    """Emit the event; True when handed to Prefect's events worker (which delivers it in the
    background, and only warns if the server is unreachable), False when skipped or refused."""
    try:
        if not _prefect_in_play():
            return False
        from prefect.events import emit_event

        emitted = emit_event(
            EVENT,
            resource={
                "prefect.resource.id": f"mlflow.registered-model.{name}.alias.{alias}",
                "prefect.resource.name": f"{name}@{alias}",
            },
            payload=payload(cfg, name, alias, version, previous, content_hash),
        )
        return emitted is not None
    except Exception as exc:  # noqa: BLE001  best effort by design: a publish never fails on its event
        log.warning("could not emit %s for %s@%s: %s", EVENT, name, alias, exc)
        return False
