"""``quantgate build|eval --plan``: a run's step reads the plan (no intake), and refuses a plan
that no longer describes what it would read."""

from __future__ import annotations

import json

import pytest

from quantgate.config import cache_dir
from quantgate.orchestrate.plan import make_plan
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit


@pytest.fixture
def plan(tiny_llama, repo_root, tmp_path):
    return make_plan(
        checkpoint=tiny_llama,
        targets=["hopper-fp8"],
        tenants=None,
        suites=["wikitext"],
        profile="smoke",
        root=repo_root,
        gates=None,
        cache=cache_dir(),
        data_dir=None,
        calibration=None,
        out=tmp_path / "run",
        step_timeout_s=60,
    )


@pytest.mark.heavy
def test_a_build_from_the_plan_runs_no_intake(cli, plan, tiny_llama, tmp_path):
    standalone = cli(
        "build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(tmp_path / "a")
    )
    assert standalone.returncode == 0, standalone.stderr
    assert standalone.stderr.count("intake: ") == 1  # what a step's log shows when it takes the source in

    run = cli("build", "--plan", str(plan.file), "--out", str(plan.artifacts_dir))
    assert run.returncode == 0, run.stderr
    assert "intake: " not in run.stderr and "source as planned" in run.stderr
    manifest = json.loads((plan.artifacts_dir / "hopper-fp8" / "manifest.json").read_text())
    assert manifest["source"]["content_hash"] == plan.source_hash
    assert manifest["recipe"]["sha256"] == plan.builds[0].recipe_sha256
    # without --plan the command resolves as the run planned: the same recipe, KV decision, source
    alone = json.loads((tmp_path / "a" / "hopper-fp8" / "manifest.json").read_text())
    assert alone["build_key"] == manifest["build_key"]


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("build", "--checkpoint", "."),
        ("build", "--root", "."),
        ("eval", "--suites", "wikitext"),
        ("eval", "--profile", "smoke"),
    ],
)
def test_an_option_the_plan_carries_is_refused(cli, plan, tmp_path, command, option, value):
    extra = ["--artifacts", str(plan.artifacts_dir)] if command == "eval" else []
    run = cli(command, "--plan", str(plan.file), option, value, *extra, "--out", str(tmp_path / "o"))
    assert run.returncode == 2
    assert f"{option}: is taken from --plan" in run.stderr and "Fix:" in run.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.heavy
@pytest.mark.parametrize("command", ["build", "eval"])
def test_a_step_refuses_a_checkpoint_changed_since_the_plan(cli, plan, tiny_llama, tmp_path, command):
    config = tiny_llama / "config.json"
    config.write_text(config.read_text().replace("{", '{"edited": true, ', 1))
    extra = ["--artifacts", str(plan.artifacts_dir), "--reference-only"] if command == "eval" else []
    run = cli(command, "--plan", str(plan.file), *extra, "--out", str(tmp_path / "o"))
    assert run.returncode == 2, run.stderr
    assert f"{config}: differs from the file intake hashed" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("command", "option", "value", "planned"),
    [
        ("build", "--targets", "hoper-fp8", {"targets": ["hoper-fp8"]}),
        ("eval", "--suites", "wikitxt", {"suites": ["wikitxt"]}),
        ("eval", "--profile", "smok", {"profile": "smok"}),
        ("build", "--gates", "BAD", {}),
        ("eval", "--gates", "BAD", {}),
        ("repair", "--gates", "BAD", {}),
    ],
)
def test_a_bad_option_is_refused_by_a_command_as_by_the_run_plan(
    cli, tiny_llama, repo_root, tmp_path, command, option, value, planned
):
    """Without --plan a command resolves its options where the run plans them: the same error (exit 2,
    naming the file or option and the fix), and nothing written in --out."""
    bad_gates = tmp_path / "gates.yaml"
    bad_gates.write_text((repo_root / "gates.yaml").read_text() + "\ntenantz: {}\n")
    if value == "BAD":
        value, planned = str(bad_gates), {"gates": bad_gates}
    options = {"targets": None, "suites": None, "profile": "smoke", "gates": None, **planned}
    with pytest.raises(InputError) as refused:
        make_plan(
            checkpoint=tiny_llama,
            tenants=None,
            root=repo_root,
            cache=cache_dir(),
            data_dir=None,
            calibration=None,
            out=tmp_path / "run",
            step_timeout_s=60,
            **options,
        )
    (tmp_path / "dir").mkdir()
    extra = {
        "eval": ["--artifacts", str(tmp_path / "dir")],
        "repair": ["--artifacts", str(tmp_path / "dir"), "--results", str(tmp_path / "dir")],
    }.get(command, [])
    run = cli(command, "--checkpoint", str(tiny_llama), option, value, *extra, "--out", str(tmp_path / "o"))
    assert run.returncode == 2, run.stderr
    assert f"error: {refused.value}" in run.stderr and "Fix:" in run.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "run").exists()
