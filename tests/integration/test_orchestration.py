"""The Prefect flow for real: a local ``prefect server``, ``quantgate run`` against it, a process
worker running a deployment from prefect.yaml, and a local Dask cluster.

The model is the tiny random Llama (the default model's flow is the README's main job, run
from a fresh clone before every release); the gate policy is a test file whose tenants judge
wikitext only, one lenient enough that every artifact passes and one that none can, so both
outcomes are exercised in a couple of minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from quantgate.publish.naming import alias_for, registered_model_name
from support.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
TARGETS = ["hopper-fp8", "draft-int4"]
GATES = """\
version: 1
model_classes:
  draft:
    description: the tiny test model's class; draft-int4 optional so a failing fp8 fails the run
    match: {moe: false, max_params: 1.5e9}
    targets: {required: [hopper-fp8], optional: [draft-int4]}
    kv_cache: bf16
tenants:
  lenient:
    description: every artifact of a working build passes
    floors: [{suite: wikitext, metric: kld_mean, max: 10.0}]
  strict:
    description: no quantized artifact can pass
    floors: [{suite: wikitext, metric: kld_mean, max: 1.0e-12}]
  support:
    description: named by eval_suites/support-domain.yaml; judged on wikitext here
    floors: [{suite: wikitext, metric: kld_mean, max: 10.0}]
"""


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"server not healthy after {seconds} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A real ``prefect server`` on loopback (SQLite), for the whole module."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    log = home / "server.log"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_healthy(f"{api}/health", proc, log)
        yield api
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, _tiny_models):
    base = tmp_path_factory.mktemp("orchestration")
    (base / "gates.yaml").write_text(GATES)
    return {"base": base, "checkpoint": _tiny_models["llama"], "gates": base / "gates.yaml"}


def _env(prefect_api: str | None, base: Path, registry: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PREFECT_HOME": str(base / "prefect-client"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{base / registry / 'mlflow.db'}",
        "QUANTGATE_ARTIFACT_URI": (base / registry / "artifacts").as_uri(),
    }
    env.pop("PREFECT_API_URL", None)
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    return env


def _quantgate_run(scenario, env, out: Path, *extra: str, targets=TARGETS) -> subprocess.CompletedProcess:
    args = [
        "run",
        "--checkpoint",
        str(scenario["checkpoint"]),
        "--gates",
        str(scenario["gates"]),
        "--suites",
        "wikitext",
        "--targets",
        ",".join(targets),
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.run(
        [sys.executable, "-m", "quantgate.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _task_states(prefect_api: str, flow_run_id: str) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {run.name: run.state.name for run in runs}


def _flow_run(prefect_api: str, flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def _aliases(tracking_uri: str, model: str, targets: list[str]) -> dict[str, set[str]]:
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    found = {}
    for target in targets:
        name = registered_model_name(model, target)
        models = client.search_registered_models(filter_string=f"name = '{name}'")
        found[target] = set(models[0].aliases) if models else set()
    return found


@pytest.fixture(scope="module")
def first_run(prefect_api, scenario):
    env = _env(prefect_api, scenario["base"], "registry")
    out = scenario["base"] / "run"
    result = _quantgate_run(scenario, env, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return env, out, json.loads((out / "outcome.json").read_text()), result


def test_quantgate_run_prints_the_summary_and_publishes_exactly_the_gates_aliases(first_run):
    env, out, outcome, result = first_run
    assert f"report: {out / 'report' / 'report.md'}" in result.stdout
    assert "lenient" in result.stdout and "registry aliases" in result.stdout
    report = json.loads((out / "report" / "report.json").read_text())
    assert outcome["approvals"] == report["approvals"]
    assert set(report["approvals"]["hopper-fp8"]) == {"lenient", "support"}  # strict: nothing passes
    expected = {t: {alias_for(tenant) for tenant in report["approvals"][t]} for t in TARGETS}
    assert _aliases(env["MLFLOW_TRACKING_URI"], outcome["model"], TARGETS) == expected


def test_the_console_shows_each_stage_and_leaves_the_tables_to_the_step_logs(first_run):
    """Issue 45, item 8: the console says when each stage started and how it ended, not every
    line of every step (the metric tables), which the step logs keep."""
    _, out, _, result = first_run
    shown = result.stderr  # Prefect's console handler writes to stderr
    for target in TARGETS:
        assert f"build {target}: started (log: {out / 'logs' / f'build-{target}.log'})" in shown
        assert f"build {target}: built in " in shown and f"evaluate {target}: 1 suite in " in shown
    assert "plan: planned in " in shown and "evaluate source: 1 suite in " in shown
    assert "gate: judged in " in shown and "publish: registered in " in shown
    assert "kld_mean" not in shown + result.stdout and "Finished in state Completed()" not in shown
    for step in ("eval-source", *(f"eval-{t}" for t in TARGETS)):
        assert "wikitext.kld_mean" in (out / "logs" / f"{step}.log").read_text(), step


def test_the_source_is_taken_in_once_per_run_and_every_step_reads_the_plan(first_run):
    """Intake runs in the plan step only: its one ``intake:`` line is in logs/plan.log, and each
    build and evaluation (a process of its own, its output in logs/<step>.log, where a step
    that took the source in would log that line too) confirmed the planned source instead."""
    _, out, outcome, _ = first_run
    logs = {p.name: p.read_text() for p in (out / "logs").glob("*.log")}
    steps = {f"build-{t}.log" for t in TARGETS} | {f"eval-{t}.log" for t in TARGETS} | {"eval-source.log"}
    assert set(logs) == steps | {"plan.log"}
    assert {name: text.count("intake: ") for name, text in logs.items()} == {
        "plan.log": 1,
        **dict.fromkeys(steps, 0),
    }
    for name in steps:
        assert logs[name].splitlines()[0].startswith("$ ") and f"--plan {out / 'plan.json'}" in logs[name]
        assert "source as planned" in logs[name], name
    plan = json.loads((out / "plan.json").read_text())
    assert plan["source"]["content_hash"] == outcome["source_hash"]
    assert [b["target"]["name"] for b in plan["builds"]] == TARGETS == outcome["targets"]


def test_a_second_run_with_unchanged_inputs_is_served_from_cache(prefect_api, scenario, first_run):
    env, out, first, _ = first_run
    states = _task_states(prefect_api, first["flow_run_id"])
    assert {states[f"build-{t}"] for t in TARGETS} == {"Completed"}

    again = _quantgate_run(scenario, env, out)
    assert again.returncode == 0, again.stderr[-3000:]
    for target in TARGETS:  # no stage ran, and the console says why
        assert f"build {target}: from the cache" in again.stderr
        assert f"evaluate {target}: from the cache" in again.stderr
    second = json.loads((out / "outcome.json").read_text())
    assert second["flow_run_id"] != first["flow_run_id"]
    states = _task_states(prefect_api, second["flow_run_id"])
    heavy = [f"build-{t}" for t in TARGETS] + [f"evaluate-{t}" for t in TARGETS]
    assert {name: states[name] for name in heavy} == dict.fromkeys(heavy, "Cached")
    assert [s for n, s in states.items() if n.startswith(("reference", "gate"))] == ["Cached", "Cached"]
    assert [s for n, s in states.items() if n.startswith(("plan", "publish"))] == ["Completed", "Completed"]
    # publishing the same content again registered no new version
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    for target in TARGETS:
        name = registered_model_name(second["model"], target)
        assert len(client.search_model_versions(f"name = '{name}'")) == 1


def test_an_artifact_rebuilt_to_the_same_bytes_is_not_evaluated_again(prefect_api, scenario, first_run):
    """The evaluation's cache key is what was built (build key, file digests), not the process
    that built it: with the builds' cached results gone, the targets are built again, to the same
    bytes, and their evaluations are still served from the cache."""
    env, out, _, _ = first_run
    records = list((scenario["base"] / "prefect-client" / "storage").glob("quantgate-build-*"))
    assert len(records) == len(TARGETS)
    for record in records:
        record.unlink()
    again = _quantgate_run(scenario, env, out)
    assert again.returncode == 0, again.stderr[-3000:]
    states = _task_states(prefect_api, json.loads((out / "outcome.json").read_text())["flow_run_id"])
    assert {states[f"build-{t}"] for t in TARGETS} == {"Completed"}
    assert {states[f"evaluate-{t}"] for t in TARGETS} == {"Cached"}


def test_targets_fan_out_over_a_local_dask_cluster_with_the_same_verdicts(prefect_api, scenario, first_run):
    env, _, threads, _ = first_run
    out = scenario["base"] / "run-dask"
    result = _quantgate_run(scenario, env, out, "--dask-workers", "2", "--max-heavy", "2", "--no-publish")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    dask = json.loads((out / "outcome.json").read_text())
    assert dask["task_runner"] == "DaskTaskRunner"
    assert dask["flow_ran_in"] not in dask["tasks_ran_in"]  # tasks ran in the Dask workers' processes
    states = _task_states(prefect_api, dask["flow_run_id"])
    assert {states[f"build-{t}"] for t in TARGETS} == {"Completed"}  # a new output directory: built anew
    assert sorted(map(json.dumps, dask["verdicts"])) == sorted(map(json.dumps, threads["verdicts"]))


def test_a_deployment_run_on_a_process_worker_ends_in_the_gates_outcome(prefect_api, scenario):
    """prefect.yaml's checkpoint-push deployment, run by `prefect deployment run` on a process
    worker; gated by the strict tenant only, so the required FP8 artifact fails: the flow run
    must end Failed, and the registry must hold no alias."""
    base = scenario["base"]
    env = {**_env(prefect_api, base, "registry-deployment"), "PWD": str(REPO)}

    def prefect(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PREFECT, "--no-prompt", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    created = prefect("work-pool", "create", "quantgate-local", "--type", "process", "--overwrite")
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect("deploy", "--name", "checkpoint-push")
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    log = base / "worker.log"
    with open(log, "w") as worker_log:
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "quantgate-local", "--type", "process"],
            env=env,
            cwd=REPO,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    out = base / "run-deployment"
    try:
        params = {
            "checkpoint": str(scenario["checkpoint"]),
            "gates": str(scenario["gates"]),
            "out": str(out),
            "suites": ["wikitext"],
            "targets": TARGETS,
            "tenants": ["strict"],
        }
        run = prefect(  # the flow's one parameter, whole (it replaces the deployment's request)
            "deployment",
            "run",
            "build-and-gate/checkpoint-push",
            "--param",
            f"request={json.dumps({**params, 'profile': 'smoke', 'publish': True})}",
            "--watch",
            "--watch-timeout",
            "600",
            timeout=660,
        )
    finally:
        _stop(worker)
    assert (out / "outcome.json").exists(), run.stdout[-3000:] + run.stderr[-2000:] + log.read_text()[-5000:]
    outcome = json.loads((out / "outcome.json").read_text())
    flow_run = _flow_run(prefect_api, outcome["flow_run_id"])
    assert flow_run.deployment_id is not None
    assert flow_run.state.name == "Failed", run.stdout[-3000:] + log.read_text()[-3000:]
    assert "hopper-fp8" in flow_run.state.message
    assert run.returncode != 0  # `--watch` reports the failed run to its caller (CI)
    assert outcome["approvals"]["hopper-fp8"] == []
    assert _aliases(env["MLFLOW_TRACKING_URI"], outcome["model"], TARGETS) == {t: set() for t in TARGETS}


def test_quantgate_run_refuses_bad_input_before_any_work_without_a_server(scenario, tmp_path):
    env = _env(None, tmp_path, "registry")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantgate.cli",
            "run",
            "--checkpoint",
            str(tmp_path / "missing"),
            "--out",
            str(tmp_path / "run"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert str(tmp_path / "missing") in result.stderr and "Fix:" in result.stderr
    assert not (tmp_path / "registry").exists() and not (tmp_path / "run" / "artifacts").exists()


def test_regating_against_tightened_floors_takes_the_withdrawn_alias_off(
    prefect_api, scenario, first_run, monkeypatch
):
    """The `regate` flow (prefect.yaml's regate deployment) on the first run's evaluations,
    with the lenient tenant's floor made impossible: its alias goes, the others stay."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_LOGGING_TO_API_ENABLED,
        temporary_settings,
    )

    from quantgate.orchestrate.flow import regate

    env, out, first, _ = first_run
    tightened = scenario["base"] / "gates-tightened.yaml"
    tightened.write_text(
        GATES.replace(
            "floors: [{suite: wikitext, metric: kld_mean, max: 10.0}]\n  strict",
            "floors: [{suite: wikitext, metric: kld_mean, max: 1.0e-12}]\n  strict",
        )
    )
    for key in ("MLFLOW_TRACKING_URI", "QUANTGATE_ARTIFACT_URI"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(REPO)
    with temporary_settings(
        {
            PREFECT_API_URL: prefect_api,
            PREFECT_HOME: env["PREFECT_HOME"],
            PREFECT_LOGGING_TO_API_ENABLED: False,
        }
    ):
        state = regate(out=str(out), gates=str(tightened), return_state=True)
    assert state.is_completed(), state.message  # hopper-fp8 still passes support
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["approvals"]["hopper-fp8"] == ["support"]
    aliases = _aliases(env["MLFLOW_TRACKING_URI"], first["model"], TARGETS)
    assert aliases == {t: {alias_for("support")} for t in TARGETS}

    # floors no quantized artifact can meet: the run fails, publishes nothing, withdraws the rest
    impossible = scenario["base"] / "gates-impossible.yaml"
    impossible.write_text(GATES.replace("max: 10.0}", "max: 1.0e-12}"))
    with temporary_settings(
        {
            PREFECT_API_URL: prefect_api,
            PREFECT_HOME: env["PREFECT_HOME"],
            PREFECT_LOGGING_TO_API_ENABLED: False,
        }
    ):
        state = regate(out=str(out), gates=str(impossible), return_state=True)
    assert state.is_failed() and "report" in state.message
    assert _aliases(env["MLFLOW_TRACKING_URI"], first["model"], TARGETS) == {t: set() for t in TARGETS}


def test_an_edit_to_an_included_tenants_file_is_a_new_verdict_on_the_same_cache(
    prefect_api, scenario, first_run
):
    """Identity from content (issue 45): gates.yaml includes its tenants from another file; an edit
    there is a new gate key, so ``quantgate run`` on the same cache gates again and the verdict
    moves (before, the key hashed gates.yaml's own bytes and the cached verdict came back). The
    targets are twins (one recipe): one build step builds hopper-fp8 and links rocm-cdna3-fp8."""
    base = scenario["base"]
    head, tenants = GATES.split("tenants:\n", 1)
    included = base / "tenants-included.yaml"
    included.write_text("tenants:\n" + tenants)
    gates = base / "gates-include.yaml"
    gates.write_text("include: [tenants-included.yaml]\n" + head)
    env = _env(prefect_api, base, "registry-include")
    out = base / "run-include"
    twins = ["hopper-fp8", "rocm-cdna3-fp8"]
    first = _quantgate_run({**scenario, "gates": gates}, env, out, targets=twins)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "lenient" in json.loads((out / "report" / "report.json").read_text())["approvals"]["hopper-fp8"]
    outcome = json.loads((out / "outcome.json").read_text())
    states = _task_states(prefect_api, outcome["flow_run_id"])
    assert states["build-hopper-fp8+rocm-cdna3-fp8"] in ("Completed", "Cached")
    assert not any(name in states for name in ("build-hopper-fp8", "build-rocm-cdna3-fp8"))
    rocm = json.loads((out / "artifacts" / "rocm-cdna3-fp8" / "manifest.json").read_text())
    assert rocm["build"]["linked_from"] == "hopper-fp8"
    weights = next((out / "artifacts" / "rocm-cdna3-fp8").glob("*.safetensors"))
    assert weights.stat().st_ino == (out / "artifacts" / "hopper-fp8" / weights.name).stat().st_ino

    included.write_text(included.read_text().replace("max: 10.0}", "max: 1.0e-12}", 1))
    again = _quantgate_run({**scenario, "gates": gates}, env, out, targets=twins)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "lenient" not in json.loads((out / "report" / "report.json").read_text())["approvals"]["hopper-fp8"]
    )
    states = _task_states(prefect_api, json.loads((out / "outcome.json").read_text())["flow_run_id"])
    assert [s for n, s in states.items() if n.startswith("gate")] == ["Completed"]
