"""Model classes from ``gates.yaml``: how a checkpoint is classified and which targets it gets.

The policy differs per model class rather than fleet-wide: large MoE models are the most
quantization-robust, dense long-context reasoners are the accuracy canary (FP4 only when its
gate passes), drafts are quantized maximally because their errors cost acceptance, not
correctness. Rules are tried in the order written; the first whose conditions all hold wins.

Tenant floors live in the same file under ``tenants:``; this module reads only the part the
build needs and ignores the rest, so the gate's schema can grow without touching intake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, model_validator

from quantgate.config.loader import load_model, nearest
from quantgate.config.targets import Catalog, Frozen, KVCache
from quantgate.errors import ConfigFileError, UsageError


class Match(Frozen):
    """Conditions on the intake record; every condition given must hold."""

    moe: bool | None = None
    min_params: NonNegativeFloat | None = None
    max_params: NonNegativeFloat | None = None
    min_context: int | None = Field(None, description="max_position_embeddings at least this")


class TargetSet(Frozen):
    required: list[str]
    optional: list[str] = Field(
        default_factory=list, description="built and evaluated, shipped only where their gate passes"
    )


class ModelClass(Frozen):
    description: str
    match: Match
    targets: TargetSet
    kv_cache: KVCache


class Policy(BaseModel):
    """The ``model_classes`` part of gates.yaml (other top-level keys belong to the gate)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: int = 1
    model_classes: dict[str, ModelClass]

    @model_validator(mode="after")
    def _targets_exist(self, info: Any) -> Policy:
        catalog: Catalog | None = (info.context or {}).get("catalog") if info else None
        if catalog is None:
            return self
        known = catalog.target_names()
        for cls_name, cls in self.model_classes.items():
            for name in (*cls.targets.required, *cls.targets.optional):
                if name not in known:
                    hint = nearest(name, known)
                    raise ValueError(
                        f"model class '{cls_name}' names unknown target '{name}'"
                        + (f" (did you mean '{hint}'?)" if hint else "")
                    )
        return self

    def classify(self, *, moe: bool, params: int, context: int | None) -> str:
        for name, cls in self.model_classes.items():
            m = cls.match
            if m.moe is not None and m.moe != moe:
                continue
            if m.min_params is not None and params < m.min_params:
                continue
            if m.max_params is not None and params > m.max_params:
                continue
            if m.min_context is not None and (context or 0) < m.min_context:
                continue
            return name
        raise ConfigFileError(
            "gates.yaml",
            f"no model class matches this checkpoint (moe={moe}, params={params:,}, context={context})",
            "add a catch-all class at the end of model_classes, or pass --targets",
        )


def load_policy(path: Path, catalog: Catalog) -> Policy:
    return load_model(path, Policy, catalog=catalog)


def check_target_names(names: list[str], catalog: Catalog) -> list[str]:
    """``--targets`` as given, refusing an unknown name with the nearest known one."""
    known = catalog.target_names()
    for name in names:
        if name not in known:
            hint = nearest(name, known)
            raise UsageError(
                "--targets",
                f"unknown target '{name}'",
                (f"did you mean '{hint}'? " if hint else "") + f"known targets: {', '.join(known)}",
            )
    return list(dict.fromkeys(names))


def resolve_targets(policy: Policy, model_class: str, override: list[str] | None, catalog: Catalog) -> list[str]:
    """Targets for one run: the class's required and optional ones, or ``--targets``."""
    if override:
        return check_target_names(override, catalog)
    cls = policy.model_classes[model_class]
    return [*cls.targets.required, *cls.targets.optional]
