"""The run is typed end to end (issue 45, item 2): one ``RunRequest`` in, from ``quantgate run``, the
flow's parameters or a deployment's JSON, and every field of it reaches the plan by name.

Before, the flow took twenty keyword parameters, packed them into an ``options`` dict and planned
with ``make_plan(**{**options, "checkpoint": local})``: following ``checkpoint`` from the command
line stopped at that dict, a deployment's misspelt field was a signature error of Prefect's, and an
unknown ``device`` became the CPU without a word. These tests fail on that code: the flow had no
``request`` parameter and ``plan_of`` did not exist.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from prefect.exceptions import ParameterTypeError, SignatureMismatchError
from pydantic import ValidationError

from quantgate.orchestrate import RunRequest, usage_error
from quantgate.orchestrate.flow import build_and_gate, plan_of

pytestmark = pytest.mark.unit

DEPLOYMENT = {
    "request": {
        "checkpoint": "s3://ckpts/llama/step-120000/",
        "targets": ["hopper-fp8", "draft-int4"],
        "tenants": ["chat"],
        "suites": ["wikitext"],
        "profile": "full",
        "publish": False,
        "out": "/cache/quantgate/runs/42",
        "max_heavy": 4,
        "step_timeout_s": 3600,
        "sequential": False,
        "repair": True,
        "device": "cuda",
        "devices": "2",
        "max_memory": "40GB",
    }
}


def test_a_deployments_json_parameters_round_trip_to_the_same_request():
    """What a deployment stores (JSON) is validated by Prefect into the request the command line
    would build, and the request written back as JSON is the same parameters again."""
    given = json.loads(json.dumps(DEPLOYMENT))  # as the API stores and hands them back
    request = build_and_gate.validate_parameters(given)["request"]
    assert isinstance(request, RunRequest)
    assert request == RunRequest(
        checkpoint="s3://ckpts/llama/step-120000/",
        targets=["hopper-fp8", "draft-int4"],
        tenants=["chat"],
        suites=["wikitext"],
        profile="full",
        publish=False,
        out=Path("/cache/quantgate/runs/42"),
        max_heavy=4,
        step_timeout_s=3600.0,
        sequential=False,
        repair=True,
        device="cuda",
        devices="2",
        max_memory="40GB",
    )
    again = json.loads(request.model_dump_json(exclude_defaults=True))
    assert again == {**DEPLOYMENT["request"], "step_timeout_s": 3600.0}
    assert RunRequest.model_validate_json(request.model_dump_json()) == request


def test_every_build_and_gate_deployment_in_prefect_yaml_is_a_valid_request(repo_root):
    """prefect.yaml's parameters are validated as the flow will validate them at run time."""
    config = yaml.safe_load((repo_root / "prefect.yaml").read_text())
    deployments = [d for d in config["deployments"] if d["entrypoint"].endswith(":build_and_gate")]
    assert len(deployments) == 2
    for deployment in deployments:
        request = build_and_gate.validate_parameters(deployment["parameters"])["request"]
        assert isinstance(request, RunRequest), deployment["name"]
    gpu = next(d for d in deployments if d["name"] == "checkpoint-push-gpu")
    assert build_and_gate.validate_parameters(gpu["parameters"])["request"].device == "cuda"


@pytest.mark.parametrize(
    ("request_json", "says"),
    [
        ({"checkpont": "/ckpt"}, "request.checkpont: Extra inputs are not permitted"),
        ({"max_heavy": "four"}, "request.max_heavy: Input should be a valid integer"),
        ({"device": "gpu"}, "request.device: Input should be 'auto', 'cpu' or 'cuda'"),
        ({"step_timeout_s": 0}, "request.step_timeout_s: Value error, 0 is not a time limit"),
        ({"devices": "0"}, "request.devices: Value error, '0' is not a number of devices"),
        ({"targets": []}, "request.targets: Value error, name at least one"),
        ({"profile": "huge"}, "request.profile: Value error, unknown profile 'huge'"),
    ],
)
def test_a_bad_deployment_parameter_is_refused_naming_its_field(request_json, says):
    with pytest.raises(ParameterTypeError) as refused:
        build_and_gate.validate_parameters({"request": request_json})
    assert says in str(refused.value)


def test_the_old_flat_parameters_are_refused_by_name_not_ignored():
    """A trigger still passing ``checkpoint=...`` at the top level fails before the run starts."""
    with pytest.raises(SignatureMismatchError, match=r"expects parameters \['request'\].*\['checkpoint'\]"):
        build_and_gate.validate_parameters({"checkpoint": "/ckpt"})


def test_a_bad_option_of_quantgate_run_is_one_usage_error_naming_the_option():
    with pytest.raises(ValidationError) as caught:
        RunRequest(step_timeout_s=float("inf"))
    error = usage_error(caught.value)
    assert error.exit_code == 2
    assert (
        str(error) == "--step-timeout: inf is not a time limit. Fix: pass a finite number of seconds above 0"
    )
    with pytest.raises(ValidationError) as caught:
        RunRequest(max_heavy=-1)
    assert str(usage_error(caught.value)).startswith(
        "--max-heavy: Input should be greater than or equal to 0"
    )


def test_the_checkpoint_and_every_other_field_reach_the_plan(tiny_llama, repo_root, tmp_path):
    """The parameter walk: a request as a deployment sends it (JSON) is planned, and its checkpoint
    is the plan's source, its targets, tenants, suites and settings the plan's, none lost or
    replaced by a default on the way."""
    from quantgate.config import cache_dir

    sent = {
        "checkpoint": str(tiny_llama),
        "targets": ["draft-int4"],
        "tenants": ["chat"],
        "suites": ["wikitext"],
        "out": str(tmp_path / "run"),
        "root": str(repo_root),
        "cache_dir": str(cache_dir()),
        "max_heavy": 3,
        "step_timeout_s": 120,
        "sequential": False,
        "device": "cpu",
        "devices": "1",
        "max_memory": "2GB",
        "verbose": True,
    }
    request = build_and_gate.validate_parameters({"request": json.loads(json.dumps(sent))})["request"]
    plan = plan_of(request, run_id="run-1")
    assert plan.source.path == str(tiny_llama)
    assert (plan.targets, plan.tenants, plan.suite_names) == (["draft-int4"], ["chat"], ["wikitext"])
    assert (plan.profile, plan.sequential, plan.device, plan.devices, plan.max_memory) == (
        "smoke",
        False,
        "cpu",
        "1",
        "2GB",
    )
    assert (plan.max_heavy, plan.step_timeout_s, plan.verbose, plan.run_id) == (3, 120.0, True, "run-1")
    assert (plan.out, plan.root, plan.cache_dir) == (str(tmp_path / "run"), str(repo_root), str(cache_dir()))
    assert plan.gates == str(repo_root / "gates.yaml") and plan.calibration is not None
    assert json.loads(plan.file.read_text())["source"]["path"] == str(tiny_llama)  # written, stamped
    assert plan.stamp


def _string_key_reads(path: Path) -> list[str]:
    """``x["key"]`` reads and ``.get("key")`` calls in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0] if node.args else None
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_run_reads_no_results_by_string_key(repo_root):
    """The flow and ``quantgate run`` read their inputs and results as fields (118 string-key reads
    before, in flow.py and cli/run.py); what is left is the one dict Prefect hands a cache key
    function, the task's parameters."""
    src = repo_root / "src" / "quantgate"
    files = [src / "orchestrate" / "flow.py", src / "orchestrate" / "run.py", src / "cli" / "run.py"]
    found = [read for path in files for read in _string_key_reads(path)]
    assert [read.split(": ", 1)[1] for read in found] == ["parameters['plan']"], found
