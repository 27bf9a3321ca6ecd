"""What one run is asked to do: ``RunRequest``, the one object ``quantgate run``, the flow
``build_and_gate`` and a deployment's parameters all pass.

Why one object: the run's inputs were keyword arguments, then the flow's ``options`` dict, then
``make_plan(**options)``, so a name could not be followed from the command line to the plan (the
checkpoint changed meaning between the flow and its plan, a deployment's typo was a Prefect
signature error, and an unknown ``device`` became the CPU silently). Now the command line builds a
``RunRequest`` once, Prefect validates a deployment's ``{"request": {...}}`` against the same model
(``validate_parameters``), and the plan is made from its fields by name (``plan_of`` in ``flow``).

How the run is carried out (Prefect's task runner: threads or Dask) is not part of it: the command
line picks that (``run_flow``), a deployment by its worker's environment.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from quantgate.config import Frozen
from quantgate.evaluate import DEFAULT as SEQUENTIAL_DEFAULT
from quantgate.runtime.errors import UsageError

Name = str  # a target, tenant or suite name, as --targets / --tenants / --suites give it


class RunRequest(Frozen):
    """One run's inputs, validated; each field is the ``quantgate run`` option of the same name."""

    checkpoint: str | None = Field(
        None, description="a directory or s3://bucket/prefix; None: the embedded SmolLM2-135M-Instruct"
    )
    targets: list[Name] | None = Field(None, description="None: the model class's targets")
    tenants: list[Name] | None = Field(None, description="None: every tenant")
    suites: list[Name] | None = Field(None, description="None: every suite in eval_suites/")
    profile: str = "smoke"
    publish: bool = True
    out: Path = Path("runs")
    gates: Path | None = Field(None, description="None: <root>/gates.yaml")
    calibration: Path | None = Field(None, description="None: <root>/calibration_sets/default.yaml")
    data_dir: Path | None = Field(None, description="None: $QUANTGATE_DATA, else ../shared/datasets")
    cache_dir: Path | None = Field(None, description="None: $QUANTGATE_CACHE or ~/.cache/quantgate")
    root: Path | None = Field(None, description="None: $QUANTGATE_ROOT, else the checkout")
    max_heavy: int = Field(1, ge=0, description="heavy steps at once across flow runs; 0: no limit")
    step_timeout_s: float = 6 * 3600.0
    sequential: bool = SEQUENTIAL_DEFAULT
    repair: bool = False
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where builds and evaluations compute; auto: CUDA when torch sees a GPU"
    )
    devices: str = Field("all", description="how many devices one evaluation spreads over: 'all' or a count")
    max_memory: str | None = Field(None, description="a size (40GB) or 'auto'; None: no offloading")
    verbose: bool = False

    @field_validator("step_timeout_s", mode="before")
    @classmethod
    def _a_time_limit(cls, value: object) -> object:
        """Checked before pydantic's own float parsing, so that 'nan', 'inf' and 0 get the one message."""
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and (not math.isfinite(value) or value <= 0):  # type: ignore[arg-type,operator]
            raise ValueError(f"{value} is not a time limit")
        return value

    @field_validator("targets", "tenants", "suites")
    @classmethod
    def _names(cls, names: list[str] | None) -> list[str] | None:
        """A list given is a list of names: an empty one, or an empty name, is a mistake, not 'all'."""
        if names is not None and (not names or any(not n.strip() for n in names)):
            raise ValueError("name at least one, and no empty name (leave the option out for all)")
        return names

    @field_validator("devices")
    @classmethod
    def _a_count(cls, devices: str) -> str:
        """'all' or a count of at least 1 (whether the host has them is checked where it runs)."""
        if devices != "all" and not (devices.isdigit() and int(devices) >= 1):
            raise ValueError(f"{devices!r} is not a number of devices")
        return devices

    @field_validator("profile")
    @classmethod
    def _profile(cls, profile: str) -> str:
        from quantgate.evaluate import PROFILES

        if profile not in PROFILES:
            raise ValueError(f"unknown profile '{profile}' (use one of {', '.join(PROFILES)})")
        return profile


# the command-line option of each field whose name is not the option's (--<field with dashes>)
_OPTIONS = {"step_timeout_s": "--step-timeout", "sequential": "--sequential/--fixed"}
_FIXES = {
    "step_timeout_s": "pass a finite number of seconds above 0",
    "devices": "pass all or a count such as 2",
    "max_heavy": "pass 0 (no limit) or a positive count",
}


def option_of(field: str) -> str:
    """The ``quantgate run`` option that sets ``field``."""
    return _OPTIONS.get(field, "--" + field.replace("_", "-"))


def usage_error(exc: ValidationError) -> UsageError:
    """The first problem of a request the command line built, as a usage error naming its option
    (exit 2, one line, no traceback)."""
    first = exc.errors(include_url=False, include_input=False)[0]
    field = str(first["loc"][0]) if first["loc"] else "request"
    error = (first.get("ctx") or {}).get("error")
    problem = str(error) if isinstance(error, ValueError) else first["msg"]
    return UsageError(
        option_of(field), problem, _FIXES.get(field, f"see quantgate run --help for {option_of(field)}")
    )
