"""An exporter process that stands in for one vLLM replica's metrics, for a real Prometheus to scrape.

Run as a script: ``python vllm_exporter.py --port P --model M --version V [--rate R] [--slower S]
[--error-rate E] [--seed N]``. It serves, on ``/metrics``, vLLM's metric names and labels
(``vllm/v1/metrics/loggers.py``: ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:e2e_request_latency_seconds`` histograms and the
``vllm:request_success_total`` counter by ``finished_reason``, labelled ``model_name``) plus the
``version`` label a fleet's scrape adds. Traffic is simulated: at every scrape the replica has
served ``rate`` requests a second since the last one, their latencies drawn from a lognormal
(``quantgate.rollout.simulate``, exact bucket probabilities), every latency times ``slower``, a
share ``error_rate`` of them aborted.

The TTFT and ITL buckets are 2 % apart (vLLM's own double, and judge only large changes: an
operator who wants 10 % resolution sets finer ones, as here); E2E keeps vLLM's bounds.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from quantgate.rollout import simulate as sim

NAMES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
BUCKETS = {
    "ttft": sim.geometric_buckets(0.02, 5.0, 1.02),
    "itl": sim.geometric_buckets(0.002, 0.5, 1.02),
    "e2e": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, float("inf")),
}
SHAPES = {  # medians: TTFT 0.2 s, ITL 0.02 s, E2E 2 s
    "ttft": sim.Shape("lognormal", 0.5, 0.2),
    "itl": sim.Shape("lognormal", 0.5, 0.02),
    "e2e": sim.Shape("lognormal", 0.5, 2.0),
}


class Replica:
    """One replica's cumulative telemetry, advanced to now at every scrape."""

    def __init__(self, model: str, version: str, rate: float, slower: float, error_rate: float, seed: int):
        self.labels = [model, version]
        self.rate, self.slower, self.error_rate = rate, slower, error_rate
        self.rng = np.random.default_rng(seed)
        self.counts = {k: np.zeros(len(b), dtype=np.int64) for k, b in BUCKETS.items()}
        self.sums = dict.fromkeys(BUCKETS, 0.0)
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def advance(self) -> None:
        now = time.monotonic()
        n = int(self.rate * (now - self.last))
        if n <= 0:
            return
        self.last = now
        for key, bounds in BUCKETS.items():
            hist = sim.histogram(self.rng, SHAPES[key], bounds, n, key, self.slower)
            self.counts[key] += np.asarray(hist.cumulative_counts)
            self.sums[key] += n * float(SHAPES[key].dist(self.slower).mean())
        aborted = int(self.rng.binomial(n, self.error_rate))
        length = int(self.rng.binomial(n - aborted, 0.1))
        self.finished["abort"] += aborted
        self.finished["length"] += length
        self.finished["stop"] += n - aborted - length

    def collect(self):
        with self.lock:
            self.advance()
            labels = ["model_name", "version"]
            for key, name in NAMES.items():
                family = HistogramMetricFamily(name, f"{key} (stand-in for vLLM)", labels=labels)
                buckets = [
                    ("+Inf" if b == float("inf") else repr(b), int(c))
                    for b, c in zip(BUCKETS[key], self.counts[key], strict=True)
                ]
                family.add_metric(self.labels, buckets, self.sums[key])
                yield family
            success = CounterMetricFamily(
                "vllm:request_success",
                "finished requests (stand-in for vLLM)",
                labels=[*labels, "finished_reason"],
            )
            for reason, count in self.finished.items():
                success.add_metric([*self.labels, reason], count)
            yield success


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--rate", type=float, default=1000.0, help="simulated requests a second")
    parser.add_argument("--slower", type=float, default=1.0)
    parser.add_argument("--error-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    registry = CollectorRegistry()
    registry.register(Replica(args.model, args.version, args.rate, args.slower, args.error_rate, args.seed))
    _server, thread = start_http_server(args.port, addr="127.0.0.1", registry=registry)
    thread.join()


if __name__ == "__main__":
    main()
