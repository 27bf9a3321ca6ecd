"""The serving check's result as typed data: what the manifest records and the report shows.

Kept free of heavy imports (pydantic only) so that the manifest and report.json models can
use it without importing the check itself.
"""

from __future__ import annotations

from quantgate.runtime.frozen import FrozenRecord


class Refusal(FrozenRecord):
    """One rule the engine would fail at load: where, why, and the engine source it comes from."""

    rule: str
    layer: str  # the first layer (in name order) that breaks the rule, or "config.json"
    reason: str
    source: str  # vLLM file and function reproduced, with the release read
    layers: int = 1  # how many layers break it


class RefusedDeployment(FrozenRecord):
    """A (release, tensor-parallel size) of the contract that cannot load the artifact."""

    version: str
    tp: int
    refusals: list[Refusal]


class ServingTable(FrozenRecord):
    """The serving check of one artifact against its target's contract."""

    engine: str
    min_version: str
    versions: list[str]  # releases checked: min_version and every newer release read
    hardware: list[str]
    kv_cache: str  # what the engine will run the KV cache in, from what the artifact declares
    loadable_tp: list[int]  # TP sizes that load at every release checked
    refused: list[RefusedDeployment] = []

    @property
    def refused_tp(self) -> list[int]:
        """TP sizes that some release checked cannot load."""
        return sorted({r.tp for r in self.refused})

    def first_refusal(self, tp: int) -> tuple[str, Refusal] | None:
        """(release, refusal) of the first reason ``tp`` is refused, or None when it loads."""
        for deployment in self.refused:
            if deployment.tp == tp and deployment.refusals:
                return deployment.version, deployment.refusals[0]
        return None

    def first_refusals(self) -> list[tuple[int, str, Refusal]]:
        """(TP size, release, first refusal) for every refused TP size, smallest first."""
        out = []
        for tp in self.refused_tp:
            found = self.first_refusal(tp)
            if found is not None:
                out.append((tp, *found))
        return out

    def summary(self, tp: int) -> str:
        """One line: why ``tp`` cannot load (its first refusal), or that it loads."""
        found = self.first_refusal(tp)
        if found is None:
            return f"TP {tp}: loads"
        version, r = found
        more = f" (+{r.layers - 1} more layers)" if r.layers > 1 else ""
        return f"TP {tp}: {self.engine} {version} refuses {r.layer}{more}: {r.rule}: {r.reason} [{r.source}]"
