"""The global limit on heavy steps (builds, evaluations), and how a killed run gives its slot back.

Prefect's global concurrency limit ``quantgate-heavy`` bounds heavy steps across every flow run
on one Prefect server. A slot is held under a lease that the holder renews while it runs; a
holder killed with ``kill -9`` stops renewing, and a server's *repossessor* service revokes the
expired lease and frees the slot. The ephemeral server that ``quantgate run`` starts without
``PREFECT_API_URL`` runs no repossessor and keeps leases in its own memory, which dies with it,
while the slot count lives on in the database: one killed run used to leave the limit full
forever, and every later run waited for a slot that nobody held.

So, without a server: leases are kept in files under ``PREFECT_HOME`` (Prefect's filesystem
lease storage, shared by every ephemeral server on the machine), and a step that waits longer
than a lease for a slot revokes expired leases itself, as the repossessor would. A slot of a
killed run is free again within about two lease durations.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

HEAVY = "quantgate-heavy"
LEASE_S = 60.0  # renewed by the holder while it runs; what a killed holder keeps the slot for
_LEASE_STORAGE = "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"
_FILE_LEASES = "prefect.server.concurrency.lease_storage.filesystem"

_LOCAL_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_LOCAL_SLOTS_LOCK = threading.Lock()
stopping = threading.Event()  # set when the run is being stopped: waiting steps give up


def ephemeral() -> bool:
    """Whether this process talks to an ephemeral server (no ``PREFECT_API_URL``)."""
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value()


def use_file_leases() -> None:
    """Before the ephemeral server starts (it is a child process that reads the environment):
    keep leases in files, so a later run can see and revoke a killed run's expired lease."""
    if ephemeral():
        os.environ.setdefault(_LEASE_STORAGE, _FILE_LEASES)


def ensure_limit(max_heavy: int) -> None:
    """Create (or resize) the global limit; without it ``concurrency`` is a no-op."""
    if max_heavy <= 0:
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(HEAVY, max_heavy)


def reclaim_expired(log: Callable[[str], None] = lambda _: None) -> int:
    """Free the slots nobody holds any more, as a server's repossessor would; the number freed.

    Two kinds: slots under an expired lease (its holder was killed), and slots counted on the
    limit under no lease at all (held under in-memory leases by an ephemeral server that has
    since exited: what quantgate before file leases left behind). A no-op with a real server,
    which runs its own repossessor, and where leases are not kept in files.
    """
    if not ephemeral() or os.environ.get(_LEASE_STORAGE) != _FILE_LEASES:
        return 0
    from prefect.client.orchestration import get_client
    from prefect.utilities.asyncutils import run_coro_as_sync

    leases: tuple[list[UUID], list[Any]] = run_coro_as_sync(_leases()) or ([], [])
    expired, active = leases
    with get_client(sync_client=True) as client:
        for lease_id in expired:
            client.release_concurrency_slots_with_lease(lease_id)
        limit = client.read_global_concurrency_limit_by_name(HEAVY)
        leased = sum(lease.metadata.slots for lease in active if limit.id in lease.resource_ids)
        orphaned = max(0, limit.active_slots - leased)
        if orphaned:
            client.release_concurrency_slots([HEAVY], orphaned, occupancy_seconds=1.0)  # must be > 0
    freed = len(expired) + orphaned
    if freed:
        log(f"freed {freed} '{HEAVY}' slot(s) that no live run holds (a killed run's)")
    return freed


async def _leases() -> tuple[list[UUID], list[Any]]:
    """The expired lease ids, and the live leases that carry slot counts, in the file storage."""
    from prefect.server.concurrency.lease_storage.filesystem import ConcurrencyLeaseStorage

    storage = ConcurrencyLeaseStorage()
    expired = await storage.read_expired_lease_ids(limit=1000)
    active = [await storage.read_lease(i) for i in await storage.read_active_lease_ids(limit=1000)]
    return expired, [lease for lease in active if lease is not None and lease.metadata is not None]


@contextlib.contextmanager
def held(max_heavy: int, log: Callable[[str], None] = lambda _: None) -> Iterator[None]:
    """Hold a heavy-step slot: a process-local one, then the global ``quantgate-heavy`` one.

    The global limit bounds heavy steps across flow runs and Dask workers, but Prefect polls
    for a free slot with back-off, which left the steps of one run idle between them
    (BENCHMARKS.md). The local semaphore hands a slot over as soon as a step ends, so within a
    process the global slot is normally free when asked for. Waiting for the global slot is
    done a lease at a time: between tries, expired leases are reclaimed and a stopping run
    gives up (``InterruptedError``) instead of waiting on.
    """
    if max_heavy <= 0:
        yield
        return
    from prefect.concurrency.sync import concurrency

    with _LOCAL_SLOTS_LOCK:
        local = _LOCAL_SLOTS.setdefault(max_heavy, threading.BoundedSemaphore(max_heavy))
    with local, contextlib.ExitStack() as slot:
        while True:
            if stopping.is_set():
                raise InterruptedError("the run is stopping: not starting another heavy step")
            try:
                slot.enter_context(
                    concurrency(
                        HEAVY, occupy=1, strict=False, lease_duration=LEASE_S, timeout_seconds=LEASE_S
                    )
                )
                break
            except TimeoutError:
                log(f"waiting for a free '{HEAVY}' slot (held by another run, or by a killed one)")
                reclaim_expired(log)
        yield
