"""The layers docs/ARCHITECTURE.md draws hold in the code (issue 26 item 1).

pyproject.toml's ``[tool.importlinter]`` contracts say it: the stages, the contracts and the shared
helpers keep one order (a module imports only what lies below it), no two packages import each
other, and a stage's modules are imported by that stage alone: every other module goes through
the stage's ``__init__``. Here they are run on the tree, and on a copy of it with a deliberate
violation, which must fail naming the import; every name a stage's ``__init__`` lists must resolve.

import-linter sees the imports that run. It does not see an import made by string
(``importlib.import_module("quantgate.x")``, a plugin registry's ``"quantgate.x:Name"`` and the
modules it imports by their decorators' names), and the contracts leave out those under
``if TYPE_CHECKING:``. bench/house/architecture_scan.py draws the house with every arrow, those
included: here it must show no circle and no arrow running back up the layers, and a string import
or a type-only import planted upward must show.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
STAGES = sorted(
    p.parent.name
    for p in (ROOT / "src" / "quantgate").glob("*/__init__.py")
    if p.parent.name != "stats"  # a library of public modules
)


def _scan():
    """bench/house/architecture_scan.py as a module (bench is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "architecture_scan", ROOT / "bench" / "house" / "architecture_scan.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _house(project: Path) -> dict:
    scan = _scan()
    return scan.house(project, scan.modules(project / "src"))


def test_the_house_counting_string_and_type_only_imports_has_no_circle_and_no_arrow_back_up():
    drawn = _house(ROOT)
    assert drawn["kinds"]["string"] > 0 and drawn["kinds"]["type"] > 0  # both kinds are drawn
    assert drawn["circles"] == [], drawn["circles"]
    assert drawn["up"] == [], drawn["up"]


@pytest.mark.parametrize(
    "module, line, named",
    [
        # configuration importing a stage by string, at run time
        (
            "config/suites.py",
            '\n\ndef _late():\n    import importlib\n\n    return importlib.import_module("quantgate.evaluate.runner")\n',
            "quantgate.config.suites -> quantgate.evaluate.runner (string)",
        ),
        # a helper naming a stage's type for the type checker only
        (
            "declarations/metrics.py",
            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from quantgate.gate import Before\n",
            "quantgate.declarations.metrics -> quantgate.gate",
        ),
        # a registry below the stages naming a stage's protocol and package
        (
            "declarations/kinds.py",
            '\nOTHER = PluginRegistry("x", "quantgate.x", "quantgate.evaluate.suites", "register", "quantgate.evaluate.suites.kind:SuiteKind")\n',
            "quantgate.declarations.kinds -> quantgate.evaluate.suites.kind (string)",
        ),
    ],
)
def test_an_upward_string_or_type_only_import_shows(tmp_path, module, line, named):
    shutil.copytree(ROOT / "src" / "quantgate", tmp_path / "src" / "quantgate")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for extra in ("bench", "scripts"):
        (tmp_path / extra).mkdir()
    target = tmp_path / "src" / "quantgate" / module
    target.write_text(target.read_text() + line)
    drawn = _house(tmp_path)
    assert any(named in arrow for arrow in drawn["up"]), drawn["up"]
    assert drawn["circles"], "the planted arrow closes a circle through the stage's own imports"


def _lint(project: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the ``quantgate`` found first on ``project/src``, with ``project``'s contracts."""
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(project / "pyproject.toml")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_contracts_hold():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, line, broken, named",
    [
        # a stage reaching into another's module: past its __init__, and between independent layers
        (
            "report/console.py",
            "from quantgate.gate.verdict import BLOCKING\n",
            ["Only quantgate.gate itself imports its modules", "layer order"],
            "quantgate.report.console -> quantgate.gate.verdict",
        ),
        # configuration importing a stage: upward, and a cycle (evaluate imports config)
        (
            "config/targets.py",
            "from quantgate.evaluate import DataDir\n",
            ["layer order", "No import cycle"],
            "quantgate.config.targets -> quantgate.evaluate",
        ),
        # a contract importing a stage, hidden in a function
        (
            "contracts/artifact.py",
            "\n\ndef _late():\n    from quantgate.serving import ServingTable\n\n    return ServingTable\n",
            ["layer order"],
            "quantgate.contracts.artifact -> quantgate.serving",
        ),
    ],
)
def test_a_violation_fails_naming_it(tmp_path, module, line, broken, named):
    shutil.copytree(ROOT / "src" / "quantgate", tmp_path / "src" / "quantgate")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "src" / "quantgate" / module
    text = target.read_text()
    # after the module's own imports when the line is an import, else at its end
    at = text.index("\n\n\n") if line.startswith("from ") else len(text)
    target.write_text(text[:at] + "\n" + line + text[at:])

    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    for contract in broken:
        assert any(contract in row and "BROKEN" in row for row in _rows(done.stdout)), (contract, done.stdout)
    assert named in done.stdout


def _rows(report: str) -> list[str]:
    """The contract summary lines (a long name wraps onto a second line before KEPT or BROKEN)."""
    lines, rows = report.splitlines(), []
    for i, text in enumerate(lines):
        if text.endswith(("KEPT", "BROKEN")):
            rows.append(
                ((lines[i - 1] + " ") if not lines[i - 1].endswith(("KEPT", "BROKEN")) else "") + text
            )
    return rows


@pytest.mark.parametrize("stage", STAGES)
def test_every_public_name_of_a_stage_resolves(stage):
    package = importlib.import_module(f"quantgate.{stage}")
    names = getattr(package, "__all__", [])
    missing = [name for name in names if not hasattr(package, name)]
    assert not missing, f"quantgate.{stage}.__all__ lists {missing}, which do not resolve"
