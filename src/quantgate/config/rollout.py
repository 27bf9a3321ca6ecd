"""A tenant's rollout policy (``tenants.<name>.rollout`` in gates.yaml): how a version the gate
passed reaches the tenant's traffic, and the live and replay floors a canary is held to.

Why in gates.yaml: the gate's floors say what a version must show offline; these say what it must
show on the fleet's own hardware before it takes all of a tenant's traffic. Both are the tenant's
policy, reviewed together. Every field has a default, so ``rollout: {strategy: canary}`` alone gives a
1 % canary judged on latency and errors (the decision is ``quantgate.rollout.decision``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.frozen import Frozen


class LiveFloors(Frozen):
    """What the canary's live telemetry must show against stable's (``None``: not judged).

    Latency: p99 not worse than stable's by more than ``max_p99_increase`` (relative), and not
    above the tenant's SLO (seconds). Errors: rate not higher than stable's by more than
    ``max_error_rate_increase`` (absolute: 0.005 is half a percentage point)."""

    max_p99_increase: float = Field(default=0.10, ge=0.0, le=10.0)
    slo_ttft_p99_s: PositiveFloat | None = None
    slo_itl_p99_s: PositiveFloat | None = None
    latency_metrics: tuple[Literal["ttft", "itl", "e2e"], ...] = ("ttft", "itl")
    max_error_rate_increase: float | None = Field(default=0.005, ge=0.0, le=1.0)


class ReplayFloors(Frozen):
    """What paired replays (the same prompts through stable and canary) must show; ``None``: not
    judged. KL values are clipped at ``kl_cap`` so the test sees bounded values: a promotion then
    says the mean of the clipped KL is below ``max_kl``."""

    min_top1_agreement: float | None = Field(default=None, ge=0.0, le=1.0)
    min_exact_match: float | None = Field(default=None, ge=0.0, le=1.0)
    max_kl: PositiveFloat | None = None
    kl_cap: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _cap_above_floor(self) -> ReplayFloors:
        if self.max_kl is not None and self.max_kl >= self.kl_cap:
            raise ValueError(f"max_kl {self.max_kl:g} must be below kl_cap {self.kl_cap:g}")
        return self

    @property
    def any(self) -> bool:
        """Whether any replay floor is set (then replay evidence is required to promote)."""
        return any(v is not None for v in (self.min_top1_agreement, self.min_exact_match, self.max_kl))


class MinimumEvidence(Frozen):
    """Nothing is promoted on less than this, however clear the tests already are."""

    requests: PositiveInt = 10_000  # canary requests
    replay_pairs: int = Field(default=200, ge=0)


class RolloutPolicy(Frozen):
    """One tenant's rollout: ``canary`` (a share of traffic, judged) or ``direct`` (the gate's
    pass moves ``approved-<tenant>`` at once, as before rollouts: the default, since a canary needs
    the fleet's telemetry and a scheduled watcher). The first release of a tenant always goes
    direct: there is no stable version to compare with."""

    strategy: Literal["canary", "direct"] = "direct"
    share: float = Field(
        default=0.01, gt=0.0, lt=1.0, description="the canary's share of the tenant's traffic"
    )
    minimum: MinimumEvidence = MinimumEvidence()
    max_duration_hours: PositiveFloat = 72.0
    at_max_duration: Literal["hold", "rollback"] = "hold"
    live: LiveFloors = LiveFloors()
    replay: ReplayFloors = ReplayFloors()
    confidence: float | None = Field(default=None, gt=0.5, lt=1.0, description="default: the tenant's")


def load_rollout(path: str | Path) -> dict[str, tuple[RolloutPolicy, float]]:
    """Every tenant's (policy, confidence) from gates.yaml, the rollout sections alone (a publish
    or a fleet watcher needs no suite or target catalog); ConfigFileError naming the file."""
    from quantgate.config.loader import read_yaml

    path = Path(path)
    data, _ = read_yaml(path)
    tenants = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(tenants, dict):
        raise ConfigFileError(path, "has no 'tenants' mapping", "add the tenants and their floors")
    out = {}
    for name, tenant in tenants.items():
        tenant = tenant if isinstance(tenant, dict) else {}
        try:
            policy = RolloutPolicy.model_validate(tenant.get("rollout") or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ConfigFileError(
                path,
                f"tenants.{name}.rollout.{where}: {err['msg']}",
                "fix the tenant's rollout policy in gates.yaml (see README, 'Rollout')",
            ) from None
        confidence = policy.confidence or float(tenant.get("confidence", 0.95))
        out[str(name)] = (policy, confidence)
    return out


def canary_shares(path: str | Path) -> dict[str, float]:
    """tenant -> canary traffic share, for the tenants whose policy is a canary (none when gates.yaml
    is absent: a registry used without a project)."""
    path = Path(path)
    if not path.is_file():
        return {}
    return {t: p.share for t, (p, _) in load_rollout(path).items() if p.strategy == "canary"}
