"""The command line is a package of thin commands (issue 26 item 4): every command is reachable by
``python -m quantgate.cli`` and the ``quantgate`` script, the options shared by several commands
are the same objects in each, ``run`` takes what its steps take, and ``pull`` loads nothing of the
build side."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

from quantgate.cli import build, commands, evaluate, gate, options, repair, run
from quantgate.cli.commands import app

pytestmark = pytest.mark.unit

STEPS = {"build", "eval", "gate", "report", "publish", "pull", "repair", "run"}
SUPPORT = {"__init__", "__main__", "commands", "options"}  # the package's modules that are no command


def test_every_command_module_is_registered():
    modules = {p.stem for p in Path(commands.__file__).parent.glob("*.py")} - SUPPORT
    commands_ = {c.callback.__module__.rsplit(".", 1)[1] for c in app.registered_commands}
    groups = {g.typer_instance.info.name or g.name for g in app.registered_groups}  # `quantgate rollout …`
    assert commands_ | groups == modules
    assert STEPS <= {c.name for c in app.registered_commands}


def _option_types(command) -> dict[str, object]:
    hints = get_type_hints(command, include_extras=True)
    return {name: hints[name] for name in inspect.signature(command).parameters}


@pytest.mark.parametrize(
    "name, declared",
    [
        ("targets", options.TargetsOpt),
        ("tenants", options.TenantsOpt),
        ("gates", options.GatesOpt),
        ("cache", options.CacheOpt),
        ("root", options.RootOpt),
        ("data_dir", options.DataDirOpt),
        ("calibration", options.CalibrationOpt),
    ],
)
def test_a_shared_option_is_declared_once(name, declared):
    commands = [build.build, evaluate.eval_, gate.gate, repair.repair, run.run]
    taking = [c for c in commands if name in inspect.signature(c).parameters]
    assert taking, name
    for command in taking:
        assert _option_types(command)[name] == declared, f"{command.__module__} declares {name} itself"


def test_run_takes_what_its_steps_take():
    steps = set(inspect.signature(build.build).parameters) | set(inspect.signature(evaluate.eval_).parameters)
    per_run = {"plan_file", "artifacts", "reference_only", "out"}  # a step's own: the run makes them
    assert steps - per_run <= set(inspect.signature(run.run).parameters)


def test_pull_imports_nothing_of_the_build_side():
    code = (
        "import sys; sys.argv = ['quantgate', 'pull', '--help']\n"
        "from quantgate.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "import quantgate.cli.pull, quantgate.publish\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['quantgate', 'orchestrate'],"
        " ['quantgate', 'quantize'], ['quantgate', 'evaluate'])))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
