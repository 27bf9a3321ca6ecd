"""``quantgate repair`` as a release engineer runs it on a run directory: the plan beside the
results supplies the source, recipes, calibration and suites; the report gains its repair section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.orchestrate.plan import make_plan
from quantgate.runtime.progress import SILENT
from support.cli import quantgate
from support.repair_project import TARGET, write_gates

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, repo_root, _tiny_models):
    """A planned run of the tiny Llama's NVFP4 artifact: built, evaluated and gated by the CLI."""
    from quantgate.config import cache_dir
    from support.repair_project import make_project

    tmp_path = tmp_path_factory.mktemp("repair-command")
    project = make_project(tmp_path / "project", repo_root)
    tiny_llama = _tiny_models["llama"]
    out = tmp_path / "run"
    plan = make_plan(
        checkpoint=tiny_llama,
        targets=[TARGET],
        tenants=None,
        suites=["tiny-text"],
        profile="smoke",
        root=project,
        gates=None,
        cache=cache_dir(),
        data_dir=project / "data",
        calibration=None,
        out=out,
        step_timeout_s=600,
    )
    env = {"QUANTGATE_CACHE": str(cache_dir())}
    for step in (
        ["build", "--plan", str(plan.file), "--out", str(out / "artifacts")],
        ["eval", "--plan", str(plan.file), "--artifacts", str(out / "artifacts"), "--out", str(out / "eval")],
    ):
        done = quantgate(*step, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    kld = json.loads((out / "eval" / "summary.json").read_text())[TARGET]["tiny-text.kld_mean"]
    write_gates(project, loose=kld / 2, impossible=kld / 1e6)
    gated = quantgate(
        "gate", "--results", str(out / "eval"), "--out", str(out / "report"), "--root", str(project), env=env
    )
    assert gated.returncode == 1  # the only (required) target passes no tenant
    return out, env


def _repair(out, env, *options: str):
    return quantgate(
        "repair", "--results", str(out / "eval"), "--artifacts", str(out / "artifacts"), *options, env=env
    )


def test_options_the_plan_already_fixes_are_refused(run_dir):
    out, env = run_dir
    done = _repair(out, env, "--root", "/tmp", "--out", str(out / "refused"))
    assert done.returncode == 2
    assert "--root" in done.stderr and "is taken from the plan here" in done.stderr
    assert not (out / "refused").exists()


def test_repair_reads_the_plan_prints_each_search_and_adds_its_section_to_the_report(run_dir):
    out, env = run_dir
    done = _repair(out, env)
    assert done.returncode == 0, done.stderr[-2000:]  # 'loose' found a variant ('impossible' did not)
    outcome = json.loads((out / "repair" / "repair.json").read_text())
    (target,) = outcome["targets"]
    found = {t["tenant"]: t["k"] for t in target["tenants"]}
    assert found["impossible"] is None and 0 < found["loose"] < 8
    assert f"{TARGET} x loose: k={found['loose']} -> " in done.stdout
    assert (
        f"{TARGET} x impossible: no variant (no variant passes: even with all 8 layer groups kept it fails)"
        in done.stdout
    )
    variant = out / "repair" / "variants" / TARGET / f"k{found['loose']:03d}"
    hint = f"publish: quantgate publish --report {variant}/publish --artifacts {variant}/artifacts"
    assert hint in done.stdout
    published = quantgate(
        *hint.removeprefix("publish: quantgate ").split(), env=env
    )  # the hint works as printed
    assert published.returncode == 0, published.stderr[-2000:]
    assert "approved-loose" in published.stdout
    report_md = (out / "report" / "report.md").read_text()
    assert "## Repair (mixed-precision variants of failed targets)" in report_md
    assert json.loads((out / "report" / "report.json").read_text())["repairs"][0]["target"] == TARGET


def test_an_unknown_tenant_is_a_usage_error_naming_the_option(run_dir):
    out, env = run_dir
    done = _repair(out, env, "--tenants", "lose", "--out", str(out / "refused-tenant"))
    assert done.returncode == 2
    assert "--tenants" in done.stderr and "loose" in done.stderr  # did you mean
    assert not (out / "refused-tenant").exists()


def test_without_the_plan_repair_resolves_the_inputs_the_run_planned(run_dir):
    """``--plan none``: the options are resolved as the run resolved them (``resolve_plan``), so the
    same source, recipes, KV decisions, calibration set, suites, profile and design are repaired with."""
    from quantgate.config import cache_dir
    from quantgate.orchestrate.repair_inputs import _from_options, _from_plan

    out, _ = run_dir
    plan = json.loads((out / "plan.json").read_text())
    options = dict.fromkeys(
        ("--checkpoint", "--calibration", "--data-dir", "--gates", "--cache-dir", "--root")
    )
    planned, _, _ = _from_plan(out / "plan.json", options, SILENT)
    options |= {
        "--checkpoint": Path(plan["source"]["path"]),
        "--data-dir": Path(plan["data_dir"]),
        "--root": Path(plan["root"]),
        "--cache-dir": cache_dir(),
    }
    before = sorted(out.rglob("*"))  # other tests of the module may have repaired into out already
    resolved, project, gates = _from_options(out / "eval", options, SILENT)
    assert (project, gates) == (Path(plan["root"]), Path(plan["gates"]))
    assert resolved.source == planned.source and resolved.planned == planned.planned
    assert (resolved.calibration, resolved.ctx.data) == (planned.calibration, planned.ctx.data)
    assert [s.spec for s in resolved.suites] == [s.spec for s in planned.suites]
    assert (resolved.model, resolved.sequential, resolved.ctx.profile) == (
        planned.model,
        planned.sequential,
        planned.ctx.profile,
    )
    assert sorted(out.rglob("*")) == before  # resolving wrote nothing
