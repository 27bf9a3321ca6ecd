"""Where the live evidence is read: Prometheus, and the serving engine's metric and label names.

Operators already scrape their engine; quantgate reads what is there rather than asking for a
second pipeline. Engines name their metrics differently, so the names are data: a telemetry file
(``telemetry.yaml``, or any path given) picks an engine preset and overrides any name in it;
without a file, the environment (``QUANTGATE_PROMETHEUS_URL``, ``QUANTGATE_TELEMETRY_ENGINE``)
picks the preset. vLLM's preset is the default, its names checked against vLLM's own
``vllm/v1/metrics/loggers.py``: histograms ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds`` (before v0.9 only ``vllm:time_per_output_token_seconds``,
preset ``vllm-v0``) and ``vllm:e2e_request_latency_seconds``; the counter
``vllm:request_success_total`` labelled ``finished_reason`` (``stop``, ``length``, ``abort``)
and ``model_name``. vLLM has no version label: a fleet adds one when it scrapes (a relabel rule
from the pod's labels), and ``version_label`` names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import Field, HttpUrl, PositiveFloat, ValidationError

from quantgate.runtime.errors import SettingError, first_problem
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.suggest import did_you_mean

ENV_URL = "QUANTGATE_PROMETHEUS_URL"
ENV_ENGINE = "QUANTGATE_TELEMETRY_ENGINE"
ENV_FILE = "QUANTGATE_TELEMETRY_FILE"
SERIES_FIX = "set metrics.{key} in the telemetry file (or pick another engine preset)"


class EngineMetrics(Frozen):
    """One engine's metric names (histogram base names, without ``_bucket``) and labels."""

    ttft: str = Field(min_length=1)
    itl: str = Field(min_length=1)
    e2e: str = Field(min_length=1)
    requests: str = Field(min_length=1, description="counter of finished requests, every finish reason")
    model_label: str = Field(min_length=1)
    version_label: str = Field(min_length=1)
    finish_reason_label: str = Field(min_length=1)
    error_reasons: tuple[str, ...] = Field(min_length=1, description="finish reasons counted as errors")


_VLLM = EngineMetrics(
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    requests="vllm:request_success_total",
    model_label="model_name",
    version_label="version",
    finish_reason_label="finished_reason",
    error_reasons=("abort", "error"),
)
ENGINES: dict[str, EngineMetrics] = {
    "vllm": _VLLM,
    "vllm-v0": _VLLM.model_copy(update={"itl": "vllm:time_per_output_token_seconds"}),
}


class TelemetrySettings(Frozen):
    """The telemetry file: the Prometheus server, the engine preset and overrides of its names."""

    version: int = Field(default=1, ge=1, le=1)
    prometheus_url: HttpUrl
    engine: str = "vllm"
    metrics: dict[str, str | list[str]] = Field(default_factory=dict, description="overrides of the preset")
    timeout_s: PositiveFloat = 10.0

    def engine_metrics(self, where: str | Path = "telemetry settings") -> EngineMetrics:
        """The preset with this file's overrides applied, validated."""
        if self.engine not in ENGINES:
            raise SettingError(
                where, f"unknown engine '{self.engine}'", did_you_mean(self.engine, list(ENGINES))
            )
        base = ENGINES[self.engine].model_dump()
        unknown = sorted(set(self.metrics) - set(base))
        if unknown:
            raise SettingError(
                where, f"unknown key metrics.{unknown[0]}", did_you_mean(unknown[0], list(base), known="keys")
            )
        try:
            return EngineMetrics.model_validate({**base, **self.metrics})
        except ValidationError as exc:
            raise SettingError(
                where, first_problem(exc), "give every metric and label a non-empty name"
            ) from None

    @property
    def base_url(self) -> str:
        """The server's URL without a trailing slash, for joining API paths."""
        return str(self.prometheus_url).rstrip("/")


def load_telemetry(path: str | Path | None = None) -> TelemetrySettings:
    """The settings from ``path`` (or ``QUANTGATE_TELEMETRY_FILE``), else from the environment."""
    path = path or os.environ.get(ENV_FILE)
    if path is None:
        url = os.environ.get(ENV_URL)
        if not url:
            raise SettingError(
                None,
                "no Prometheus server is configured",
                f"set {ENV_URL}=http://host:9090, or pass a telemetry file with prometheus_url",
            )
        data: object = {"prometheus_url": url, "engine": os.environ.get(ENV_ENGINE, "vllm")}
        where: str | Path = ENV_URL
    else:
        where = Path(path)
        try:
            data = yaml.safe_load(where.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingError(where, "telemetry file not found", "check the path") from None
        except yaml.YAMLError as exc:
            raise SettingError(where, f"not valid YAML ({exc})", "fix the YAML syntax") from None
    try:
        settings = TelemetrySettings.model_validate(data)
    except ValidationError as exc:
        raise SettingError(where, first_problem(exc), "see quantgate/rollout/evidence/settings.py") from None
    settings.engine_metrics(where)  # an unknown engine or metric key fails here, at load
    return settings
