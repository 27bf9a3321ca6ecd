"""Shared fixtures: tiny random checkpoints, an isolated cache, and a guard against stray files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker (and every process it starts: the CLI commands under test)
    computes on its share of the cores, never more threads than cores in all. Measured on 2 cores
    (bench/house/omp_oversubscription.py, BENCHMARKS.md): a decode-sized loop took 2.08 s alone, 26.1 s
    in each of two 2-thread processes at once (idle OpenMP threads spin for the cores the other
    needs), 4.7 s in each at 1 thread. An
    ``OMP_NUM_THREADS`` already set is kept. Evaluations key their caches by thread count
    (``evaluate.environment``), so no number computed under one count is paired with another."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


_share_the_cores()

from quantgate.config.targets import Catalog  # after the thread count is set
from support.models import write_tiny_model

REPO = Path(__file__).resolve().parents[1]


# The modules whose tests use the converted default model and its four artifacts (session
# fixtures, minutes to make): one worker runs them all, so they are made once per run.
DEFAULT_MODEL_MODULES = frozenset(
    f"tests/integration/{name}.py"
    for name in (
        "test_damaged_artifacts",
        "test_default_model",
        "test_eval_default",
        "test_registry_roundtrip",
    )
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` (pyproject's addopts) with the default model's modules as one scope:
    a module's tests run on one worker (its module fixtures, a Prefect or MLflow server, are made
    once), and so do all of ``DEFAULT_MODEL_MODULES``. (xdist's own ``loadgroup`` cannot do it
    under pytest 9.2, whose node ids it can no longer rename.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DefaultModelOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "default-model" if module in DEFAULT_MODEL_MODULES else module

    return DefaultModelOnOneWorker(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test of the default model outside ``DEFAULT_MODEL_MODULES`` would convert and build it
    again on another worker: refused, naming the list to add its module to."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if "default_model" in getattr(item, "fixturenames", ()) and module not in DEFAULT_MODEL_MODULES:
            raise pytest.UsageError(
                f"{module} uses the default model: add it to DEFAULT_MODEL_MODULES in tests/conftest.py"
            )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog(REPO)


@pytest.fixture(scope="session")
def _tiny_models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny-models")
    return {kind: write_tiny_model(base / kind, kind) for kind in ("llama", "mixtral", "qwen2_moe")}


@pytest.fixture
def tiny_llama(_tiny_models, tmp_path) -> Path:
    """A fresh copy per test, so a test may damage it freely."""
    return Path(shutil.copytree(_tiny_models["llama"], tmp_path / "tiny-llama"))


@pytest.fixture
def tiny_mixtral(_tiny_models, tmp_path) -> Path:
    return Path(shutil.copytree(_tiny_models["mixtral"], tmp_path / "tiny-mixtral"))


@pytest.fixture
def tiny_qwen_moe(_tiny_models, tmp_path) -> Path:
    return Path(shutil.copytree(_tiny_models["qwen2_moe"], tmp_path / "tiny-qwen-moe"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never touch the user's cache or registry; the converted default model is shared per session.

    Session-scoped, so that module- and session-scoped fixtures (which run before any
    function-scoped one) see the same isolated cache as the tests themselves. The registry a
    command finds by default is an absent SQLite file (approved nothing, created by nothing that
    only looks), so a developer's artifacts_registry/ never feeds a test's gate a baseline;
    tests that publish name their own.
    """
    base = tmp_path_factory.getbasetemp()
    shared = os.environ.get("QUANTGATE_TEST_CACHE") or str(base / "cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QUANTGATE_CACHE", shared)
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{base / 'no-registry' / 'mlflow.db'}")
        patch.delenv("QUANTGATE_ARTIFACT_URI", raising=False)
        yield


def _repo_listing() -> set[str]:
    skip = {".git", ".venv", ".pytest_cache", ".ruff_cache", ".tools", "__pycache__"}
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        for name in files:
            if not name.endswith(".pyc"):
                found.add(os.path.relpath(os.path.join(root, name), REPO))
    return found


def _user_cache_listing() -> set[str]:
    home_cache = Path.home() / ".cache" / "quantgate"
    return {str(p) for p in home_cache.rglob("*")} if home_cache.exists() else set()


@pytest.fixture(autouse=True, scope="session")
def _no_stray_files():
    """Fail the session if tests leave files in the repository or the user's quantgate cache
    (they belong in tmp_path and the isolated test cache)."""
    before, cache_before = _repo_listing(), _user_cache_listing()
    yield
    stray = sorted(_repo_listing() - before)
    assert not stray, f"tests left files in the repository: {stray[:10]}"
    leaked = sorted(_user_cache_listing() - cache_before)
    assert not leaked, f"tests wrote into the user's cache: {leaked[:10]}"
