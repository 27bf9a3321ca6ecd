"""Plugins that cannot load (issue 44, item 4): every command refuses, exit 2, in one line naming
the entry point and its distribution, before any work.

Before: a suite-kind plugin whose module calls ``sys.exit(0)`` on import ended ``quantgate gate``
with exit 0, no report and no error (a pass to a CI job reading the exit code); a plugin that
raised, or named a missing module or attribute, was a traceback; two distributions giving one
name, one taken silently. Each plugin here is a real distribution (a ``.dist-info`` with its
``entry_points.txt``) on the command's ``PYTHONPATH``, as ``pip install --target`` leaves one;
the commands run in a fresh interpreter, as CI runs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

E1 = Path(__file__).resolve().parents[1] / "gate" / "fixtures" / "e1"


def _distribution(site: Path, name: str, module: str, body: str, entry_points: str) -> None:
    """``name`` 0.1 installed into ``site``: its module and its metadata."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(body)
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def _env(*sites: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([*map(str, sites), os.environ.get("PYTHONPATH", "")])}


def _one_line(run) -> str:
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


COMMANDS = {
    "build": ["build", "--targets", "hopper-fp8", "--out", "{out}"],
    "eval": ["eval", "--artifacts", "{tmp}/artifacts", "--out", "{out}"],
    "gate": ["gate", "--results", str(E1), "--model-class", "dense-reasoner", "--out", "{out}"],
    "report": ["report", "--report", "{tmp}/report"],
    "publish": ["publish", "--report", "{tmp}/report", "--artifacts", "{tmp}/artifacts"],
    "pull": ["pull", "m", "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", "{out}"],
    "release": ["release", "m", "--target", "hopper-fp8", "--tenant", "chat", "--renew"],
    "repair": ["repair", "--results", str(E1), "--artifacts", "{tmp}/artifacts", "--out", "{out}"],
    "run": ["run", "--targets", "hopper-fp8", "--out", "{out}"],
    "seed": ["seed", "--cache-dir", "{out}"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_plugin_that_exits_0_on_import(cli, tmp_path, command):
    site = tmp_path / "site"
    _distribution(
        site,
        "acme-exit",
        "acme_exit",
        "import sys\nsys.exit(0)\n",
        "[quantgate.suite_kinds]\nacme_exit = acme_exit:Kind\n",
    )
    out = tmp_path / "out"
    args = [a.format(out=out, tmp=tmp_path) for a in COMMANDS[command]]
    run = cli(*args, env=_env(site))
    assert run.returncode == 2, (run.returncode, run.stdout[-500:], run.stderr[-2000:])
    line = _one_line(run)
    assert "acme_exit = acme_exit:Kind" in line and "acme-exit 0.1" in line, line
    assert "sys.exit(0)" in line and "pip uninstall acme-exit" in line
    assert not out.exists()  # before any work


@pytest.mark.parametrize(
    ("body", "value", "says"),
    [
        ("raise RuntimeError('no GPU here')\n", "acme_bad:Kind", "raised RuntimeError: no GPU here"),
        ("import acme_not_installed\n", "acme_bad:Kind", "is not installed (acme_not_installed)"),
        ("X = 1\n", "acme_bad:Kind", "module acme_bad has no attribute 'Kind'"),
        ("X = 1\n", "acme_gone:Kind", "is not installed (acme_gone)"),
    ],
    ids=["raises", "imports-missing", "missing-attribute", "missing-module"],
)
def test_a_plugin_that_cannot_load_is_exit_2_naming_it(cli, tmp_path, body, value, says):
    site = tmp_path / "site"
    _distribution(site, "acme-bad", "acme_bad", body, f"[quantgate.engines]\nacme.bad = {value}\n")
    run = cli(
        "gate", "--results", str(E1), "--model-class", "dense-reasoner", "--out", str(tmp_path / "r2"),
        env=_env(site),
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    line = _one_line(run)
    assert says in line and f"acme.bad = {value}" in line and "acme-bad 0.1" in line, line
    assert not (tmp_path / "r2").exists()


def test_one_name_from_two_distributions_is_refused_naming_both(cli, tmp_path):
    first, second = tmp_path / "site-a", tmp_path / "site-b"
    _distribution(
        first,
        "acme-one",
        "acme_one",
        "class Kind: ...\n",
        "[quantgate.suite_kinds]\nrubric = acme_one:Kind\n",
    )
    _distribution(
        second,
        "acme-two",
        "acme_two",
        "class Kind: ...\n",
        "[quantgate.suite_kinds]\nrubric = acme_two:Kind\n",
    )
    run = cli("seed", "--cache-dir", str(tmp_path / "c"), env=_env(first, second))
    assert run.returncode == 2
    line = _one_line(run)
    assert "suite kind 'rubric' is given by two distributions" in line
    assert "acme-one 0.1 (acme_one:Kind)" in line and "acme-two 0.1 (acme_two:Kind)" in line
