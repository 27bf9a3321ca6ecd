"""The ``tenants:`` part of gates.yaml: floors per suite metric, validated against the project.

A floor names a suite (a file under ``eval_suites/``), a metric that suite's kind can measure
(see ``measures.py``) and exactly one bound:

- ``max``: the conservative (upper) bound of a lower-is-better metric must be at most this;
- ``min``: the conservative (lower) bound of a higher-is-better metric must be at least this;
- ``max_delta_pct``: a lower-is-better *level* (perplexity) may rise at most this many percent
  over the source's;
- ``min_recovery``: a higher-is-better *level* (accuracy, acceptance) must keep at least this
  fraction of the source's.

``applies_to`` (on a floor or a whole tenant) limits it to some targets, e.g. draft acceptance
to ``draft-int4``. Everything is checked when the file loads: an unknown key, suite, metric,
target, a bound of the wrong direction, or a floor on another tenant's domain suite is a
``ConfigFileError`` naming ``file:line`` and the nearest valid name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from quantgate.config.loader import load_model, nearest, read_yaml
from quantgate.config.policy import ModelClass
from quantgate.config.targets import Catalog, Frozen
from quantgate.gate.measures import SuiteInfo, measures_for

FloorKind = Literal["max", "min", "max_delta_pct", "min_recovery"]
FLOOR_KINDS: tuple[str, ...] = ("max", "min", "max_delta_pct", "min_recovery")


def _unknown(what: str, name: str, known: list[str]) -> ValueError:
    hint = nearest(name, known)
    return ValueError(f"unknown {what} '{name}'" + (f" (did you mean '{hint}'?)" if hint else f"; known: {', '.join(known)}"))


def _check_targets(names: list[str] | None, info: ValidationInfo) -> list[str] | None:
    known = (info.context or {}).get("targets")
    if names and known is not None:
        for name in names:
            if name not in known:
                raise _unknown("target", name, list(known))
    return names


class Floor(Frozen):
    suite: str
    metric: str
    max: float | None = None
    min: float | None = None
    max_delta_pct: float | None = Field(None, ge=0)
    min_recovery: float | None = Field(None, gt=0)
    applies_to: list[str] | None = Field(None, description="targets this floor gates; all when absent")
    note: str = ""

    @field_validator("suite")
    @classmethod
    def _suite_known(cls, name: str, info: ValidationInfo) -> str:
        suites: dict[str, SuiteInfo] | None = (info.context or {}).get("suites")
        if suites is not None and name not in suites:
            raise _unknown("suite", name, sorted(suites))
        return name

    @field_validator("metric")
    @classmethod
    def _metric_known(cls, name: str, info: ValidationInfo) -> str:
        suite = ((info.context or {}).get("suites") or {}).get(info.data.get("suite", ""))
        if suite is not None:
            known = measures_for(suite)
            if name not in known:
                raise ValueError(str(_unknown(f"metric for suite '{suite.name}' (kind {suite.kind})", name, sorted(known))))
        return name

    @field_validator("applies_to")
    @classmethod
    def _targets_known(cls, names: list[str] | None, info: ValidationInfo) -> list[str] | None:
        return _check_targets(names, info)

    @model_validator(mode="after")
    def _one_bound(self, info: ValidationInfo) -> Floor:
        given = [k for k in FLOOR_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(FLOOR_KINDS)} (found {len(given)}: {given})")
        suite = ((info.context or {}).get("suites") or {}).get(self.suite)
        measure = measures_for(suite).get(self.metric) if suite else None
        if measure is not None:
            kind = given[0]
            if kind in ("max", "max_delta_pct") and measure.higher_is_better:
                raise ValueError(f"{self.metric} is higher-is-better: use min or min_recovery, not {kind}")
            if kind in ("min", "min_recovery") and not measure.higher_is_better:
                raise ValueError(f"{self.metric} is lower-is-better: use max or max_delta_pct, not {kind}")
            if kind in ("max_delta_pct", "min_recovery") and not measure.level:
                use = "min" if measure.higher_is_better else "max"
                raise ValueError(f"{self.metric} already compares with the source: use {use}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in FLOOR_KINDS if getattr(self, k) is not None)

    @property
    def value(self) -> float:
        return float(getattr(self, self.kind))

    def applies(self, target: str) -> bool:
        return self.applies_to is None or target in self.applies_to


class Tenant(Frozen):
    description: str
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of every bound")
    applies_to: list[str] | None = Field(None, description="targets gated for this tenant; all when absent")
    floors: list[Floor] = Field(min_length=1)

    @field_validator("applies_to")
    @classmethod
    def _targets_known(cls, names: list[str] | None, info: ValidationInfo) -> list[str] | None:
        return _check_targets(names, info)


class Gates(BaseModel):
    """All of gates.yaml, strictly: model classes (read as the build reads them) and tenants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    model_classes: dict[str, ModelClass]
    tenants: dict[str, Tenant] = Field(min_length=1)

    @field_validator("tenants")
    @classmethod
    def _domain_suites_owned(cls, tenants: dict[str, Tenant], info: ValidationInfo) -> dict[str, Tenant]:
        suites: dict[str, SuiteInfo] = (info.context or {}).get("suites") or {}
        for name, tenant in tenants.items():
            for floor in tenant.floors:
                owner = suites.get(floor.suite, SuiteInfo(floor.suite, "")).tenant
                if owner is not None and owner != name:
                    raise ValueError(f"tenant '{name}' gates on suite '{floor.suite}', which belongs to tenant '{owner}'")
        for suite in suites.values():
            if suite.tenant is not None and suite.tenant not in tenants:
                raise _unknown(f"tenant (named by eval_suites/{suite.name}.yaml)", suite.tenant, sorted(tenants))
        return tenants


def project_suites(project_root: Path) -> dict[str, SuiteInfo]:
    """The suites under ``eval_suites/``, read as data (no suite module is imported)."""
    found = {}
    for path in sorted((Path(project_root) / "eval_suites").glob("*.yaml")):
        data, _ = read_yaml(path)
        found[path.stem] = _suite_info(path.stem, data)
    return found


def _suite_info(name: str, data: dict[str, Any]) -> SuiteInfo:
    return SuiteInfo(
        name=name,
        kind=str(data.get("kind", "")),
        tenant=data.get("tenant"),
        primary_filter=data.get("primary_filter", "flexible-extract"),
        domain_metric=data.get("metric", "contains") if isinstance(data.get("metric"), str) else "contains",
        draft_k=tuple(data.get("draft_k", [4])),
    )


def load_gates(path: Path, project_root: Path) -> Gates:
    suites = project_suites(project_root)
    targets = Catalog(project_root).target_names()
    return load_model(path, Gates, suites=suites, targets=targets)
