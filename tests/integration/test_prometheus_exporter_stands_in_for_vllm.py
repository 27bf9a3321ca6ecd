"""Live telemetry read from a real Prometheus (Debian's ``prometheus``) scraping an exporter that
stands in for vLLM's metrics: the same metric names, labels and bucket bounds as vLLM's
``vllm/v1/metrics/loggers.py``, plus the ``version`` label a fleet's scrape adds. The reader's
histograms and counts must equal what the exporter observed."""

from __future__ import annotations

import random
import time

import pytest

from tests.support.servers import free_port
from tests.support.serving_engines import prometheus, prometheus_missing

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(prometheus_missing() is not None, reason=str(prometheus_missing())),
]

BUCKETS = {  # vLLM's own bounds for these three histograms
    "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    "itl": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    "e2e": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
}
NAMES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
MODEL = "smollm2-135m-instruct"


def _cumulative(values: list[float], bounds: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(sum(v <= b for v in values) for b in bounds) + (len(values),)


@pytest.fixture(scope="module")
def exporter():
    """Two versions' traffic observed into vLLM-named metrics, served over HTTP on a free port."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

    registry = CollectorRegistry()
    labels = ["model_name", "engine", "version"]
    hists = {k: Histogram(NAMES[k], k, labels, buckets=BUCKETS[k], registry=registry) for k in NAMES}
    success = Counter("vllm:request_success", "finished", [*labels, "finished_reason"], registry=registry)
    rng = random.Random(7)
    observed: dict[str, dict] = {}
    for version, n, scale, reasons in (("3", 400, 1.0, (380, 15, 5)), ("4", 40, 1.3, (35, 3, 2))):
        values = {
            k: [
                rng.lognormvariate(0, 0.8) * scale * {"ttft": 0.05, "itl": 0.03, "e2e": 2}[k]
                for _ in range(n)
            ]
            for k in NAMES
        }
        for engine in ("0", "1"):  # two engine cores: the reader sums them
            half = slice(0, n // 2) if engine == "0" else slice(n // 2, n)
            for k, vs in values.items():
                for v in vs[half]:
                    hists[k].labels(MODEL, engine, version).observe(v)
        for reason, count in zip(("stop", "length", "abort"), reasons, strict=True):
            success.labels(MODEL, "0", version, reason).inc(count)
        observed[version] = {"values": values, "requests": sum(reasons), "aborts": reasons[2]}
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{port}", observed
    server.shutdown()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def prom(exporter):
    with prometheus([exporter[0]]) as url:
        yield url


def _settings(url: str):
    from quantgate.rollout.evidence import TelemetrySettings

    return TelemetrySettings(prometheus_url=url)


def _read_when_scraped(url: str):
    from quantgate.rollout.evidence import EvidenceFormatError, MissingSeriesError, read_live

    deadline = time.monotonic() + 30
    while True:
        try:
            return read_live(_settings(url), MODEL, "3", "4", log_errors={"4": 2})
        except (MissingSeriesError, EvidenceFormatError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_exporter_stands_in_for_vllm_histograms_and_counts_equal_observed(exporter, prom):
    _, observed = exporter
    live = _read_when_scraped(prom)
    for side, version in ((live.stable, "3"), (live.canary, "4")):
        assert side.version == version
        assert side.requests == observed[version]["requests"]
        by_metric = {h.metric: h for h in side.latency}
        assert set(by_metric) == {"ttft", "itl", "e2e"}
        for key, hist in by_metric.items():
            assert hist.upper_bounds == (*BUCKETS[key], float("inf"))
            assert hist.cumulative_counts == _cumulative(observed[version]["values"][key], BUCKETS[key])
    assert live.stable.errors == observed["3"]["aborts"]
    assert live.canary.errors == observed["4"]["aborts"] + 2  # plus the request logs' errors
    assert len(live.digest) == 64


def test_exporter_stands_in_for_vllm_missing_metric_names_the_setting(exporter, prom):
    from quantgate.rollout.evidence import MissingSeriesError, PrometheusReader, TelemetrySettings

    _read_when_scraped(prom)
    old_name = TelemetrySettings(prometheus_url=prom, engine="vllm-v0")  # time_per_output_token: not exported
    with pytest.raises(MissingSeriesError, match=r"vllm:time_per_output_token_seconds_bucket.*metrics\.itl"):
        PrometheusReader(old_name).histogram("itl", MODEL, "3")
    with pytest.raises(MissingSeriesError, match=r"no series with .*version=\"9\".*version_label"):
        PrometheusReader(_settings(prom)).histogram("ttft", MODEL, "9")


def test_unreachable_prometheus_is_transient_and_names_the_setting():
    from quantgate.rollout.evidence import EvidenceUnavailableError, PrometheusReader

    reader = PrometheusReader(_settings(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(EvidenceUnavailableError, match="unreachable.*prometheus_url") as info:
        reader.histogram("ttft", MODEL, "3")
    assert info.value.exit_code == 75
