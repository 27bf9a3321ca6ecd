"""gates.yaml as one strict model: model classes (intake's classification, the targets a class
gets) and tenants (the floors the gate holds artifacts to).

Every command reads the file through ``load_gates``, so a mistake anywhere in it fails the
first command that reads it, naming ``file:line`` and the nearest valid name: an unknown key,
target, suite or metric, a bound of the wrong direction, a ratio floor on a metric that already
compares with the source, a floor on another tenant's suite. Metrics and their directions come
from the suite kinds (``quantgate.evaluate.suites``), never from a list here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantgate.config.identity import content_digest
from quantgate.config.loader import load_model, read_yaml
from quantgate.config.rollout import RolloutPolicy
from quantgate.config.targets import Catalog, KVCache
from quantgate.declarations import PROFILES
from quantgate.runtime.errors import ConfigFileError, UsageError
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.suggest import did_you_mean, nearest
from quantgate.stats import ItemRange

if TYPE_CHECKING:
    from quantgate.declarations import SuiteDeclaration

FloorKind = Literal["max", "min", "max_delta_pct", "min_recovery", "max_regression"]
FLOOR_KINDS: tuple[str, ...] = ("max", "min", "max_delta_pct", "min_recovery", "max_regression")
ANY_PROFILE = "any"  # numerics_spread's key for spreads that hold at every evaluation profile
RATIO_KINDS = ("max_delta_pct", "min_recovery")


def _unknown(what: str, name: str, known: list[str]) -> ValueError:
    hint = nearest(name, known)
    return ValueError(
        f"unknown {what} '{name}'"
        + (f" (did you mean '{hint}'?)" if hint else f"; known: {', '.join(known)}")
    )


def _check_targets(names: list[str] | None, info: ValidationInfo) -> list[str] | None:
    known = (info.context or {}).get("targets")
    if names and known is not None:
        for name in names:
            if name not in known:
                raise _unknown("target", name, list(known))
    return names


def _suites(info: ValidationInfo) -> dict[str, SuiteDeclaration]:
    return (info.context or {}).get("suites") or {}


class Match(Frozen):
    """Conditions on the intake record; every condition given must hold."""

    moe: bool | None = None
    min_params: NonNegativeFloat | None = None
    max_params: NonNegativeFloat | None = None
    min_context: int | None = Field(None, description="max_position_embeddings at least this")


class TargetSet(Frozen):
    """The targets a model class gets: required ones must pass, optional ones ship if they pass."""

    required: list[str]
    optional: list[str] = Field(
        default_factory=list, description="built and evaluated, shipped only where their gate passes"
    )

    @field_validator("required", "optional")
    @classmethod
    def _targets_known(cls, names: list[str], info: ValidationInfo) -> list[str]:
        return _check_targets(names, info) or names


class ModelClass(Frozen):
    """One rule of ``model_classes``: which checkpoints it matches, their targets and KV cache."""

    description: str
    match: Match
    targets: TargetSet
    kv_cache: KVCache
    repair: bool = Field(
        False, description="a failed (target, tenant) of this class searches for a repaired variant"
    )


class Floor(Frozen):
    """A suite, a metric and exactly one bound, optionally limited to some targets by ``applies_to``.

    ``max`` / ``min`` bound the metric's conservative end; ``max_delta_pct`` / ``min_recovery``
    bound the ratio of a *level* metric with the source's level; ``max_regression`` bounds how
    much worse (in the metric's units) the metric may be than in the version the registry
    approves for the tenant today. ``advisory: true`` marks a floor that some models cannot
    inform (a suite the model solves nothing of): where its items carry no evidence, it is
    reported and does not fail the verdict; where they do, it gates like any floor.
    """

    suite: str
    metric: str
    max: float | None = None
    min: float | None = None
    max_delta_pct: float | None = Field(None, ge=0)
    min_recovery: float | None = Field(None, gt=0)
    max_regression: float | None = Field(
        None, ge=0, description="worse than the approved version by at most this, in the metric's units"
    )
    advisory: bool = Field(False, description="insufficient evidence on this floor does not fail the verdict")
    applies_to: list[str] | None = Field(None, description="targets this floor gates; all when absent")
    note: str = ""

    @field_validator("suite")
    @classmethod
    def _suite_known(cls, name: str, info: ValidationInfo) -> str:
        suites = (info.context or {}).get("suites")
        if suites is not None and name not in suites:
            raise _unknown("suite", name, sorted(suites))
        return name

    @field_validator("metric")
    @classmethod
    def _metric_known(cls, name: str, info: ValidationInfo) -> str:
        suite = _suites(info).get(info.data.get("suite", ""))
        if suite is not None:
            known = suite.metrics()
            if name not in known:
                raise _unknown(
                    f"metric for suite '{suite.spec.name}' (kind {suite.spec.kind})", name, sorted(known)
                )
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
        suite = _suites(info).get(self.suite)
        metric = suite.metrics().get(self.metric) if suite else None
        if metric is not None:
            kind = given[0]
            if kind in ("max", "max_delta_pct") and metric.higher_is_better:
                raise ValueError(f"{self.metric} is higher-is-better: use min or min_recovery, not {kind}")
            if kind in ("min", "min_recovery") and not metric.higher_is_better:
                raise ValueError(f"{self.metric} is lower-is-better: use max or max_delta_pct, not {kind}")
            if kind in RATIO_KINDS and not metric.level:
                use = "min" if metric.higher_is_better else "max"
                raise ValueError(f"{self.metric} already compares with the source: use {use}")
        return self

    @property
    def kind(self) -> str:
        """Which bound this floor gives: one of ``FLOOR_KINDS``."""
        return next(k for k in FLOOR_KINDS if getattr(self, k) is not None)

    @property
    def value(self) -> float:
        """The bound's value."""
        return float(getattr(self, self.kind))

    def applies(self, target: str) -> bool:
        """Whether this floor gates ``target`` (every target when ``applies_to`` is absent)."""
        return self.applies_to is None or target in self.applies_to


class Tenant(Frozen):
    """A tenant's floors, the confidence of every bound, and the targets gated for it."""

    description: str
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of every bound")
    applies_to: list[str] | None = Field(None, description="targets gated for this tenant; all when absent")
    floors: list[Floor] = Field(min_length=1)
    repair: bool = Field(False, description="a target failing this tenant searches for a repaired variant")
    rollout: RolloutPolicy = Field(
        default=RolloutPolicy(), description="how a passing version reaches traffic (canary or direct)"
    )

    @field_validator("applies_to")
    @classmethod
    def _targets_known(cls, names: list[str] | None, info: ValidationInfo) -> list[str] | None:
        return _check_targets(names, info)


class RepairBudget(Frozen):
    """How much one target's repair search may spend (``quantgate.repair.search``)."""

    # variants built and evaluated per target, the ceiling (every group kept) included
    max_evaluations: PositiveInt = 6


class ItemClass(Frozen):
    """What every mean floor's confidence covers beyond random items: the stated class, in tolerances
    of the floor (``quantgate.stats.linear``). ``worse``: no item (window, trace) is worse than no
    change by more than this many tolerances; assumed, and checked on every item, which fails the
    floor beyond it. ``better``: an item better than no change by more than this counts as this
    (conservative: it narrows the range the test needs, never the error rate)."""

    worse: float = Field(default=10.0, ge=1.0, le=1000.0)
    better: float = Field(default=1.0, ge=0.0, le=1000.0)

    def stated(self) -> ItemRange:
        """The class as the statistics take it."""
        return ItemRange(worse=self.worse, better=self.better)


class Gates(Frozen):
    """All of gates.yaml: model classes and tenants."""

    version: Literal[1] = 1
    model_classes: dict[str, ModelClass]
    tenants: dict[str, Tenant] = Field(min_length=1)
    numerics_spread: dict[str, dict[str, dict[str, NonNegativeFloat]]] = Field(
        default_factory=dict,
        description="per evaluation profile (smoke, full; 'any' for every profile), per floor kind, "
        "'<suite>.<metric>' -> how far its bound moves between machines (bench/gate/numerics_spread.py), "
        "in the floor's units: a bound this close to its floor is marginal. A mapping of floor kinds "
        "alone applies to every profile",
    )
    repair: RepairBudget = RepairBudget()
    item_range: ItemClass = Field(
        default_factory=ItemClass,
        description="the class every mean floor's confidence covers, in tolerances of the floor",
    )

    def repairs(self, model_class: str | None, tenant: str) -> bool:
        """Whether a failed verdict for ``tenant`` is repaired: the tenant's or the class's ``repair``."""
        cls = self.model_classes.get(model_class) if model_class is not None else None
        return self.tenants[tenant].repair or (cls is not None and cls.repair)

    def spread(self, floor: Floor, profile: str | None = None) -> float | None:
        """The measured machine-to-machine spread of ``floor``'s bound at ``profile``; None where
        not measured. Small windows move more than large ones (a smoke window is 512 tokens, a full
        one 2,048), so spreads are kept per profile; an unknown profile takes the largest."""
        key = f"{floor.suite}.{floor.metric}"
        tables = (
            [t for name, t in self.numerics_spread.items() if name in (profile, ANY_PROFILE)]
            if profile in PROFILES
            else list(self.numerics_spread.values())
        )
        values = [t[floor.kind][key] for t in tables if key in t.get(floor.kind, {})]
        return max(values) if values else None

    @field_validator("numerics_spread", mode="before")
    @classmethod
    def _spread_profiles(cls, spread: object) -> object:
        """Floor kinds at the top (the older form) apply to every profile."""
        if not isinstance(spread, dict):
            return spread
        known = (*PROFILES, ANY_PROFILE, *FLOOR_KINDS)
        for key in spread:
            if key not in known:
                raise _unknown("profile or floor kind", str(key), list(known))
        return {ANY_PROFILE: spread} if any(k in FLOOR_KINDS for k in spread) else spread

    @field_validator("numerics_spread")
    @classmethod
    def _spread_kinds(
        cls, spread: dict[str, dict[str, dict[str, float]]], info: ValidationInfo
    ) -> dict[str, dict[str, dict[str, float]]]:
        suites = _suites(info)
        for by_kind in spread.values():
            for kind, by_metric in by_kind.items():
                if kind not in FLOOR_KINDS:
                    raise _unknown("floor kind", kind, list(FLOOR_KINDS))
                for key in by_metric:
                    suite_name, _, metric = key.partition(".")
                    if suites and suite_name not in suites:
                        raise _unknown("suite", suite_name, sorted(suites))
                    if suites and metric not in suites[suite_name].metrics():
                        raise _unknown(
                            f"metric of suite '{suite_name}'", metric, sorted(suites[suite_name].metrics())
                        )
        return spread

    @field_validator("tenants")
    @classmethod
    def _suites_owned(cls, tenants: dict[str, Tenant], info: ValidationInfo) -> dict[str, Tenant]:
        suites = _suites(info)
        for name, tenant in tenants.items():
            for floor in tenant.floors:
                owner = suites[floor.suite].tenant if floor.suite in suites else None
                if owner is not None and owner != name:
                    raise ValueError(
                        f"tenant '{name}' gates on suite '{floor.suite}', which belongs to tenant '{owner}'"
                    )
        for suite_name, suite in suites.items():
            if suite.tenant is not None and suite.tenant not in tenants:
                raise _unknown(
                    f"tenant (named by eval_suites/{suite_name}.yaml)", suite.tenant, sorted(tenants)
                )
        return tenants

    @model_validator(mode="after")
    def _advisory_floors_can_fail(self, info: ValidationInfo) -> Gates:
        """An advisory floor that no artifact could fail on its suite's items, at some profile, is a
        floor that only ever passes or abstains: refused, naming it and the smallest size that lets
        it fail (the issue this came from: ratio floors below 8 windows could never fail)."""
        from quantgate.stats import forms

        suites = _suites(info)
        cls = self.item_range.stated()
        for name, tenant in self.tenants.items():
            for floor in tenant.floors:
                suite = suites.get(floor.suite)
                measure = suite.metrics().get(floor.metric) if suite is not None else None
                if not floor.advisory or suite is None or measure is None:
                    continue
                need = forms.items_to_fail(floor.kind, floor.value, measure, cls, 1.0 - tenant.confidence)
                for profile in getattr(suite.spec, "profiles", {}):
                    have = suite.items(profile)
                    if need is not None and have < need:
                        raise ValueError(
                            f"tenant '{name}': the advisory floor {floor.suite} {floor.metric} {floor.kind} "
                            f"{floor.value:g} can never fail at profile '{profile}' ({have} items): it needs at "
                            f"least {need}; give eval_suites/{floor.suite}.yaml's {profile} profile {need} "
                            f"items, or drop the floor"
                        )
        return self

    def classify(self, *, moe: bool, params: int, context: int | None) -> str:
        """The first model class, in the order written, whose conditions the checkpoint meets."""
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


def project_suites(catalog: Catalog) -> dict[str, SuiteDeclaration]:
    """The project's suites (``eval_suites/``), each validated by its kind's declaration."""
    from quantgate.config.suites import declare_suites

    directory = catalog.root / "eval_suites"
    return {s.spec.name: s.declaration for s in declare_suites(directory)} if directory.is_dir() else {}


_VALIDATED: dict[tuple[str, ...], Gates] = {}


def _fingerprint(path: Path, catalog: Catalog) -> tuple[str, ...] | None:
    """What validation depends on: the file's content and the suites' (includes merged: an edit to
    an included file is a new entry) and the target names."""
    try:  # bounded reads: a FIFO or /dev/zero given as --gates is refused here, naming it
        parts: list[object] = [read_yaml(path)[0]]
        for suite in sorted((catalog.root / "eval_suites").glob("*.yaml")):
            parts.append([suite.name, read_yaml(suite)[0]])
    except ConfigFileError:
        return None  # load_gates reports it, naming the file
    return (str(path.resolve()), str(catalog.root.resolve()), content_digest(parts), *catalog.target_names())


def load_gates(path: str | Path, catalog: Catalog) -> Gates:
    """gates.yaml validated against the project's suites and targets, once per process per content."""
    path = Path(path)
    key = _fingerprint(path, catalog)
    if key is not None and key in _VALIDATED:
        return _VALIDATED[key]
    gates = load_model(path, Gates, suites=project_suites(catalog), targets=catalog.target_names())
    if key is not None:
        _VALIDATED[key] = gates
    return gates


def check_target_names(names: list[str], catalog: Catalog) -> list[str]:
    """``--targets`` as given, refusing an unknown name with the nearest known one."""
    known = catalog.target_names()
    for name in names:
        if name not in known:
            raise UsageError(
                "--targets", f"unknown target '{name}'", did_you_mean(name, known, known="known targets")
            )
    return list(dict.fromkeys(names))


def resolve_targets(
    gates: Gates, model_class: str, override: list[str] | None, catalog: Catalog
) -> list[str]:
    """Targets for one run: the class's required and optional ones, or ``--targets``."""
    if override:
        return check_target_names(override, catalog)
    cls = gates.model_classes[model_class]
    return [*cls.targets.required, *cls.targets.optional]
