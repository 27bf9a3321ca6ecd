"""Run every rule over an artifact for every (release, TP size) of its target's serving contract.

Releases checked: the contract's ``min_version`` and every newer release whose rules were
read (``releases.releases_from``), since the fleet may run any of them. A TP size is loadable
when no rule refuses it at any of those releases; the artifact is refused (``ServingError``,
exit 1) when no TP size is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from quantgate.config import Target
from quantgate.contracts.serving_table import Refusal, RefusedDeployment, ServingTable
from quantgate.declarations.serving_releases import releases_from
from quantgate.runtime.errors import ConfigFileError, ServingError
from quantgate.serving.kernels import PLATFORMS
from quantgate.serving.layout import Layout, read_layout
from quantgate.serving.rules import RULES, Artifact, Deployment, Finding, Rule, platforms_for


def _refusal(rule: Rule, findings: Iterable[Finding]) -> Refusal | None:
    """The rule's first finding (layers come in name order) and how many layers break it."""
    found = list(findings)
    if not found:
        return None
    layer, reason = found[0]
    return Refusal(
        rule=rule.name,
        layer=layer,
        reason=reason,
        source=rule.source,
        layers=len({where for where, _ in found}),
    )


def kv_cache_served(layout: Layout) -> str:
    """What the engine runs the KV cache in, from what the artifact declares."""
    kv = (layout.quantization or {}).get("kv_cache_scheme")
    if kv:
        return f"fp8 e4m3 ({kv.get('strategy')} scales from the checkpoint: kv_cache_scheme)"
    return (
        f"{layout.dims.dtype} (no kv_cache_scheme: FP8 KV only if the deployment passes "
        "--kv-cache-dtype fp8, then at scale 1.0)"
    )


def check_artifact(directory: Path, target: Target) -> ServingTable:
    """The serving table of the artifact in ``directory`` against ``target``'s contract."""
    contract = target.serving
    platforms = platforms_for(target.hardware, target.numerics.native_on)
    if not platforms:
        raise ConfigFileError(
            f"targets/{target.name}.yaml",
            f"hardware '{target.hardware}' (native on {target.numerics.native_on}) names no platform whose "
            "kernels quantgate.serving models",
            f"use one of {', '.join(PLATFORMS)} as hardware, or in numerics.native_on for any-gpu",
        )
    layout = read_layout(directory)
    art = Artifact.of(layout)
    base = [r for rule in RULES if not rule.per_deployment if (r := _refusal(rule, rule.fn(art)))]
    versions = releases_from(contract.min_version)
    refused = []
    for version in versions:
        for tp in contract.tensor_parallel:
            deployment = Deployment(version, tp, platforms)
            found = base + [
                r for rule in RULES if rule.per_deployment if (r := _refusal(rule, rule.fn(art, deployment)))
            ]
            if found:
                refused.append(RefusedDeployment(version=version, tp=tp, refusals=found))
    bad = {r.tp for r in refused}
    return ServingTable(
        engine=contract.engine,
        min_version=contract.min_version,
        versions=versions,
        hardware=[p.name for p in platforms],
        kv_cache=kv_cache_served(layout),
        loadable_tp=[tp for tp in contract.tensor_parallel if tp not in bad],
        refused=refused,
    )


def refusal_message(target: str, table: ServingTable) -> str:
    """One line: the smallest TP size's first refusal (layer, TP, rule, the engine source), and the rest."""
    tps = table.refused_tp
    tp, version, r = table.first_refusals()[0]  # called only when every TP size is refused
    more = f" and {r.layers - 1} more" if r.layers > 1 else ""
    others = f"; TP {', '.join(map(str, tps[1:]))} refused as well" if len(tps) > 1 else ""
    return (
        f"{target}: no serving configuration in its contract can load this artifact "
        f"({table.engine} >= {table.min_version} at TP {', '.join(map(str, tps))}): at TP {tp} "
        f"{table.engine} {version} refuses {r.layer}{more} by rule {r.rule}: {r.reason} "
        f"[{r.source.split('; ')[0]}]{others}"
    )


def require_loadable(directory: Path, target: Target) -> ServingTable:
    """The serving table; ``ServingError`` (exit 1) when no (release, TP size) of the contract loads it."""
    table = check_artifact(directory, target)
    if not table.loadable_tp:
        raise ServingError(target.name, directory, refusal_message(target.name, table), table)
    return table
