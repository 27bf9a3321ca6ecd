"""A real serving engine and a real Prometheus on loopback, for the rollout evidence tests.

``llama_server`` runs llama.cpp's OpenAI-compatible server (``python -m llama_cpp.server``, from
the llama-cpp-python wheel that .ci/run builds from source) on a GGUF; ``requantized`` writes a
second quantization of a GGUF with llama.cpp's own quantizer; ``prometheus`` runs Debian's
``prometheus`` binary scraping the given targets every second; ``vllm_exporter`` runs a process that
stands in for one vLLM replica's metrics. Each is a child process on a free
127.0.0.1 port, stopped by its own pid when the context exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.servers import _process, free_port


def llama_cpp_missing() -> str | None:
    """Why the llama.cpp tests cannot run here, or None."""
    try:
        import llama_cpp
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        return f"llama-cpp-python (with its server extras) is not importable: {exc}; .ci/run builds it"
    return None


def requantized(gguf: Path, out: Path, ftype: str = "Q4_0") -> Path:
    """``gguf`` requantized to ``ftype`` by llama.cpp's ``llama_model_quantize``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(gguf).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc} for {gguf} -> {ftype}")
    return out


@contextlib.contextmanager
def llama_server(gguf: Path, timeout_s: float = 120, n_ctx: int = 2048) -> Iterator[str]:
    """llama.cpp's server on ``gguf`` with an ``n_ctx``-token context; yields its base URL."""
    port = free_port()
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
    args += ["--port", str(port), "--n_threads", "1", "--n_ctx", str(n_ctx)]
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
            return response.status == 200

    with _process(args, dict(os.environ), ready, "llama.cpp server", timeout_s):
        yield url


def prometheus_missing() -> str | None:
    return (
        None
        if shutil.which("prometheus")
        else "Debian's prometheus is not installed (apt-get install prometheus)"
    )


@contextlib.contextmanager
def prometheus(targets: list[str], timeout_s: float = 60) -> Iterator[str]:
    """Prometheus scraping ``targets`` (host:port) every second into a temporary TSDB; yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="quantgate-prometheus-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        scrape = {"job_name": "engine", "scrape_interval": "1s", "static_configs": [{"targets": targets}]}
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
        args = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb"]
        args += [f"--web.listen-address=127.0.0.1:{port}"]
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                return response.status == 200

        with _process(args, dict(os.environ), ready, "prometheus", timeout_s):
            yield url


@contextlib.contextmanager
def vllm_exporter(model: str, version: str, timeout_s: float = 60, **traffic: float) -> Iterator[str]:
    """An exporter process standing in for one vLLM replica (``vllm_exporter.py``: ``rate``,
    ``slower``, ``error_rate``, ``seed``); yields its ``host:port`` for Prometheus to scrape."""
    port = free_port()
    args = [sys.executable, str(Path(__file__).with_name("vllm_exporter.py")), "--port", str(port)]
    args += ["--model", model, "--version", version]
    for key, value in traffic.items():
        args += [f"--{key.replace('_', '-')}", str(value)]

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.status == 200

    with _process(args, dict(os.environ), ready, "vLLM stand-in exporter", timeout_s):
        yield f"127.0.0.1:{port}"
