"""The run's plan: made once (intake, configs, targets), written to <out>/plan.json, read back by
the steps, which check what they read from disk against it instead of trusting it blindly."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from quantgate.evaluate.data import MissingDataError
from quantgate.evaluate.suites import load_suites
from quantgate.orchestrate.plan import PLAN_FILE, PlannedSuite, make_plan, read_plan, resolve_plan
from quantgate.runtime.errors import CheckpointError, InputError, UsageError

pytestmark = pytest.mark.unit


def _plan(checkpoint, repo_root, out, **options):
    from quantgate.config import cache_dir

    defaults = {
        "targets": ["hopper-fp8"],
        "tenants": None,
        "suites": ["wikitext"],
        "profile": "smoke",
        "gates": None,
        "data_dir": None,
        "calibration": None,
        "step_timeout_s": 60,
    }
    return make_plan(
        checkpoint=checkpoint, root=repo_root, cache=cache_dir(), out=out, **{**defaults, **options}
    )


def test_the_plan_is_written_to_the_run_directory_and_read_back_as_made(tiny_llama, repo_root, tmp_path):
    plan = _plan(tiny_llama, repo_root, tmp_path / "run", targets=["hopper-fp8", "draft-int4"])
    assert plan.file == tmp_path / "run" / PLAN_FILE
    assert read_plan(plan.file) == plan
    assert sorted(p.name for p in plan.file.parent.iterdir()) == [
        ".quantgate-run",
        PLAN_FILE,
    ]  # no temporary file
    assert plan.targets == ["hopper-fp8", "draft-int4"] and plan.suite_names == ["wikitext"]
    assert plan.source.path == str(tiny_llama) and plan.source_hash == plan.source.content_hash
    assert [b.recipe.name for b in plan.builds] == ["fp8-dynamic", "w4a16-gptq-g64"]
    assert plan.calibration is not None  # draft-int4 calibrates
    assert plan.calibration_set().sha256 == plan.calibration.sha256


def test_a_step_takes_only_targets_the_plan_has(tiny_llama, repo_root, tmp_path):
    plan = _plan(tiny_llama, repo_root, tmp_path / "run")
    assert [b.target.name for b in plan.select(None)] == ["hopper-fp8"]
    with pytest.raises(UsageError, match="'hoper-fp8' is not in the plan.*did you mean 'hopper-fp8'"):
        plan.select(["hoper-fp8"])


def test_the_checkpoint_is_confirmed_unchanged_by_content_not_by_stat(tiny_llama, repo_root, tmp_path):
    plan = _plan(tiny_llama, repo_root, tmp_path / "run")
    config = tiny_llama / "config.json"
    os.utime(config, ns=(1, 1))  # a new stat with the same bytes: hashed again, and accepted
    assert plan.confirmed_source() == plan.source

    config.write_text(config.read_text().replace("{", '{"note": 1, ', 1))
    with pytest.raises(CheckpointError, match="config.json: differs from the file intake hashed"):
        plan.confirmed_source()


def test_a_file_added_to_the_checkpoint_since_planning_is_refused(tiny_llama, repo_root, tmp_path):
    plan = _plan(tiny_llama, repo_root, tmp_path / "run")
    (tiny_llama / "notes.txt").write_text("added after the plan\n")
    with pytest.raises(CheckpointError, match="notes.txt: is new since the checkpoint's intake"):
        plan.confirmed_source()


def test_a_plan_made_with_other_tool_versions_is_refused(tiny_llama, repo_root, tmp_path):
    plan = _plan(tiny_llama, repo_root, tmp_path / "run")
    data = json.loads(plan.file.read_text())
    data["tools_hash"] = "0" * 64
    plan.file.write_text(json.dumps(data))
    with pytest.raises(InputError, match="other tool versions"):
        read_plan(plan.file)


def test_a_file_that_is_not_a_plan_is_refused_naming_it(tmp_path):
    (tmp_path / "plan.json").write_text('{"version": 1}')
    with pytest.raises(
        InputError, match=r"plan.json: not a plan this quantgate wrote \(source: Field required"
    ):
        read_plan(tmp_path / "plan.json")
    with pytest.raises(InputError, match="cannot read the plan"):
        read_plan(tmp_path / "missing.json")


def test_a_calibration_set_changed_since_planning_is_refused(tiny_llama, repo_root, tmp_path):
    spec = tmp_path / "calibration.yaml"
    log = repo_root / "calibration_sets" / "traffic" / "default-traffic.jsonl"
    text = (repo_root / "calibration_sets" / "default.yaml").read_text()
    spec.write_text(text.replace("traffic/default-traffic.jsonl", str(log)))
    plan = _plan(tiny_llama, repo_root, tmp_path / "run", targets=["draft-int4"], calibration=spec)
    assert plan.calibration is not None and plan.calibration.spec == str(spec)
    spec.write_text(spec.read_text().replace("seed: 0", "seed: 1"))
    with pytest.raises(InputError, match="calibration.yaml: the calibration set is now"):
        plan.calibration_set()


def test_planned_suites_load_as_their_yaml_does(repo_root):
    for suite in load_suites(repo_root / "eval_suites"):
        planned = PlannedSuite(
            path=str(suite.path),
            kind=suite.spec.kind,
            spec=suite.spec.model_dump(mode="json"),
            spec_hash=suite.spec_hash,
        )
        loaded = PlannedSuite.model_validate_json(planned.model_dump_json()).load()
        assert (loaded.spec, loaded.path, loaded.spec_hash) == (suite.spec, suite.path, suite.spec_hash)
        assert type(loaded.runner) is type(suite.runner)


def test_bad_input_writes_no_plan(tmp_path, repo_root):
    with pytest.raises(CheckpointError):
        _plan(tmp_path / "missing", repo_root, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_evaluation_data_set_that_is_nowhere_is_refused_before_any_build(tiny_llama, repo_root, tmp_path):
    """Missing data is bad input of the plan, not a failure of every evaluation after the builds
    (the hub is off in tests: conftest sets HF_HUB_OFFLINE)."""
    from support.repair_project import make_project

    project = make_project(tmp_path / "project", repo_root)
    (project / "data" / "corpus.txt").unlink()
    with pytest.raises(MissingDataError) as info:
        _plan(tiny_llama, project, tmp_path / "run", suites=["tiny-text"], data_dir=project / "data")
    assert "corpus.txt" in str(info.value) and "--data-dir" in str(info.value)
    assert info.value.exit_code == 2
    assert not (tmp_path / "run").exists()


def test_a_copied_checkpoint_is_the_same_plan_content(tiny_llama, repo_root, tmp_path):
    first = _plan(tiny_llama, repo_root, tmp_path / "run")
    copy = shutil.copytree(tiny_llama, tmp_path / "copy")
    second = _plan(copy, repo_root, tmp_path / "run")
    assert second.source_hash == first.source_hash and second.target_hashes == first.target_hashes
    assert second.stamp == first.stamp  # the same output directory


def test_the_plan_carries_the_run_device_and_older_plans_read_as_cpu(tiny_llama, repo_root, tmp_path):
    """``quantgate run --device`` is resolved once and planned: the build and eval steps read it
    from plan.json (unless their own --device names one) and it is in the evaluation keys."""
    plan = _plan(tiny_llama, repo_root, tmp_path / "run", device="cuda")
    assert plan.device == "cuda" and read_plan(plan.file).device == "cuda"
    older = json.loads(plan.file.read_text())
    del older["device"]
    plan.file.write_text(json.dumps(older))
    assert read_plan(plan.file).device == "cpu"


def test_the_plan_hands_max_memory_to_every_evaluation_step_and_keeps_it_out_of_the_keys(
    tiny_llama, repo_root, tmp_path
):
    """``quantgate run --max-memory`` reaches each eval step's command line through the plan; the
    reference and evaluation keys do not change with it (offloading changes time, not numbers)."""
    from quantgate.orchestrate.flow import _eval_args

    plain = _plan(tiny_llama, repo_root, tmp_path / "a")
    offloaded = _plan(tiny_llama, repo_root, tmp_path / "b", max_memory="auto")
    assert read_plan(offloaded.file).max_memory == "auto" and plain.max_memory is None
    args = _eval_args(offloaded, tmp_path / "e")
    assert args[args.index("--max-memory") + 1] == "auto"
    assert "--max-memory" not in _eval_args(plain, tmp_path / "e")
    assert offloaded.eval_env == plain.eval_env and offloaded.device == plain.device


def test_build_and_eval_resolve_their_parts_as_the_run_plans_them_and_write_nothing(
    tiny_llama, repo_root, tmp_path
):
    """``quantgate build`` resolves the builds part, ``eval`` the suites part, ``run`` (make_plan)
    both, all through ``resolve_plan``: for the same options, the same targets (the model class's,
    no --targets), recipes, KV decisions, calibration set and suites; resolving writes nothing."""
    from quantgate.config import cache_dir

    options = {"checkpoint": tiny_llama, "root": repo_root, "cache": cache_dir(), "suites": ["wikitext"]}
    run = make_plan(out=tmp_path / "run", targets=None, step_timeout_s=60, **options)
    build = resolve_plan(out=tmp_path / "build", needs=["builds"], **options)
    evaluation = resolve_plan(out=tmp_path / "eval", needs=["suites"], **options)
    assert run.builds and build.builds == run.builds
    assert {b.target.name: b.kv_cache for b in build.builds} == {
        b.target.name: b.kv_cache for b in run.builds
    }
    assert (build.calibration, build.target_hashes) == (run.calibration, run.target_hashes)
    assert (evaluation.suites, evaluation.suites_hash) == (run.suites, run.suites_hash)
    assert evaluation.source == build.source == run.source
    assert (build.suites, evaluation.builds, evaluation.calibration) == ([], [], None)  # parts left out
    assert build.stamp == evaluation.stamp == "" and run.stamp
    assert not (tmp_path / "build").exists() and not (tmp_path / "eval").exists()


def test_a_part_left_out_is_neither_read_nor_required(tiny_llama, repo_root, tmp_path):
    """A build needs no evaluation data, an evaluation no calibration set: each is refused only
    where it is needed (here: the run's plan), with the same error."""
    from support.repair_project import make_project

    project = make_project(tmp_path / "project", repo_root)
    (project / "data" / "corpus.txt").unlink()
    options = {
        "checkpoint": tiny_llama,
        "root": project,
        "targets": ["draft-int4"],  # calibrated
        "suites": ["tiny-text"],
        "data_dir": project / "data",
    }
    built = resolve_plan(out=tmp_path / "b", needs=["builds"], **options)
    assert built.targets == ["draft-int4"] and built.calibration is not None
    missing = tmp_path / "no-calibration.yaml"
    (project / "data" / "corpus.txt").write_text("restored " * 100)
    evaluated = resolve_plan(out=tmp_path / "e", needs=["suites"], calibration=missing, **options)
    assert evaluated.suite_names == ["tiny-text"] and evaluated.calibration is None
    with pytest.raises(InputError, match="no-calibration.yaml"):
        resolve_plan(out=tmp_path / "r", calibration=missing, **options)
    assert not any((tmp_path / d).exists() for d in ("b", "e", "r"))
