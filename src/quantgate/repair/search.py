"""Bisection on k, the number of layer groups kept one step up, against the gate.

Keeping more groups can only bring a variant closer to the source, so passing a tenant is taken
as monotone in k: if k passes, every larger k would. Known: k = 0 (the uniform artifact) failed.
The first probe is k = n, every group kept (the ceiling: if that fails, no variant can pass and
the search stops after one evaluation); then bisection between the largest k known to fail and
the smallest known to pass, until they are adjacent or the budget of evaluations is spent. Every
probe is evaluated once and gated for every tenant being repaired, so tenants share evaluations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Probe:
    """One variant tried: k groups kept, the tenants it passed, its bytes and a quality figure."""

    k: int
    passed: frozenset[str]
    bytes: int
    quality: dict[str, float] = field(default_factory=dict)  # e.g. wikitext.kld_mean, for the frontier
    seconds: float = 0.0


@dataclass(frozen=True)
class TenantOutcome:
    """Where the search ended for one tenant: the smallest passing k (None: none) and why it stopped."""

    tenant: str
    k: int | None
    stopped: str


@dataclass(frozen=True)
class SearchResult:
    """Every probe in the order tried, and each tenant's outcome."""

    units: int
    budget: int
    probes: list[Probe]
    tenants: list[TenantOutcome]


def bisect(n: int, tenants: list[str], evaluate: Callable[[int], Probe], budget: int) -> SearchResult:
    """The smallest k in 1..n passing each tenant, with at most ``budget`` evaluations in all."""
    if n < 1 or budget < 1:
        raise ValueError(f"need at least one layer group and one evaluation (n={n}, budget={budget})")
    probes: dict[int, Probe] = {}
    order: list[Probe] = []

    def probe(k: int) -> Probe | None:
        if k not in probes:
            if len(probes) >= budget:
                return None
            probes[k] = evaluate(k)
            order.append(probes[k])
        return probes[k]

    outcomes = []
    for tenant in tenants:
        lo, hi = 0, None  # largest k known to fail, smallest known to pass
        for k, p in probes.items():  # what earlier tenants' probes already say
            if tenant in p.passed:
                hi = k if hi is None else min(hi, k)
            else:
                lo = max(lo, k)
        if hi is None and n not in probes:
            ceiling = probe(n)
            if ceiling is None:
                outcomes.append(
                    TenantOutcome(
                        tenant, None, f"budget of {budget} evaluations spent before any variant passed"
                    )
                )
                continue
            if tenant in ceiling.passed:
                hi = n
        if hi is None:
            outcomes.append(
                TenantOutcome(
                    tenant, None, f"no variant passes: even with all {n} layer groups kept it fails"
                )
            )
            continue
        stopped = ""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            tried = probe(mid)
            if tried is None:
                stopped = f"budget of {budget} evaluations spent: k={hi} passes, k={lo} fails, {hi - lo - 1} untried between"
                break
            if tenant in tried.passed:
                hi = mid
            else:
                lo = mid
        outcomes.append(TenantOutcome(tenant, hi, stopped or f"bracket closed: k={hi} passes, k={lo} fails"))
    return SearchResult(n, budget, order, outcomes)
