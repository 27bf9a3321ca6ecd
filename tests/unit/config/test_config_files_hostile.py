"""Hostile config files (issue 25): each is refused in one line naming the file (and line), exit 2.

Before the bounded reader, an ``include:`` loop ended in RecursionError, ``include: /dev/zero``
read until memory ran out, a FIFO hung, a directory was an IsADirectoryError, 20k-deep YAML a
RecursionError, a 5,000-digit integer a ValueError, and a 2 kB recipe of nested aliases was
accepted as 10^9 values (``quantgate run`` then died writing plan.json). ``.inf`` / ``.nan``
floors passed validation and the gate crashed writing report.json.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from quantgate.config.gates import Floor, load_gates
from quantgate.config.loader import read_yaml
from quantgate.declarations.suite_kinds.humaneval import SandboxLimits
from quantgate.publish.config import RegistrySettings
from quantgate.runtime.errors import ConfigFileError
from support.cli import quantgate as cli

pytestmark = pytest.mark.unit

E1 = Path(__file__).resolve().parents[1] / "gate" / "fixtures" / "e1"
BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
)  # 1.2 kB, 10^9 leaves when expanded


def _refused(
    path: Path, line: int | None = None, match: str = "", *, read: Path | None = None
) -> ConfigFileError:
    """Reading ``read`` (default ``path``) is refused in one line that starts with ``path[:line]``."""
    with pytest.raises(ConfigFileError, match=match) as err:
        read_yaml(read or path)
    message = str(err.value)
    assert "\n" not in message and "Fix:" in message
    where = re.escape(str(path)) + (f":{line}:" if line else "[:]")
    assert re.match(where, message), message
    return err.value


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


CASES = {
    "include-loop": (
        "include: [b.yaml]\nx: 1\n",
        {"b.yaml": "include: [top.yaml]\n"},
        "b.yaml",
        1,
        "include loop",
    ),
    "include-self": ("include: top.yaml\n", {}, "top.yaml", 1, "include loop"),
    "include-dev-zero": ("include: [/dev/zero]\n", {}, "top.yaml", 1, "outside the project"),
    "include-parent": ("include: [../../secret.yaml]\n", {}, "top.yaml", 1, "outside the project"),
    "include-not-a-name": ("include: [1]\n", {}, "top.yaml", 1, "not a file name"),
    "include-mapping": ("include: {a: b}\n", {}, "top.yaml", 1, "neither a file name"),
    "deep": ("a: " + "[" * 20000 + "]" * 20000 + "\n", {}, "top.yaml", 1, "nested more than 32"),
    "deep-block": (
        "".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
        {},
        "top.yaml",
        32,  # the 32nd mapping's first key is the 33rd level
        "nested",
    ),
    "digits": ("a: " + "9" * 5000 + "\n", {}, "top.yaml", 1, "integer of 5,000 characters"),
    "alias-bomb": (BOMB + "\n", {}, "top.yaml", 6, "aliases expand to more than 200,000"),
    "alias-recursive": ("a: &a [1, *a]\n", {}, "top.yaml", 1, "alias refers to the value that contains it"),
    "inf": ("a: .inf\n", {}, "top.yaml", 1, "not a finite number"),
    "nan": ("a: [1, .NaN]\n", {}, "top.yaml", 1, "not a finite number"),
    "overflow": ("a:\n  b: 1.0e+999\n", {}, "top.yaml", 2, "not a finite number"),
    "bad-tag": ("a: !!float abc\n", {}, "top.yaml", 1, "not a number"),
    "bad-timestamp": ("a: !!timestamp abc\n", {}, "top.yaml", None, "tagged value cannot be read"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_yaml_is_refused_in_one_line_naming_the_file_and_line(tmp_path, case):
    text, others, blamed, line, match = CASES[case]
    top = _write(tmp_path / "cfg" / "top.yaml", text)
    for name, body in others.items():
        _write(tmp_path / "cfg" / name, body)
    _refused(tmp_path / "cfg" / blamed, line, match, read=top)


def test_special_files_are_refused_before_a_byte_is_read(tmp_path):
    cfg = tmp_path / "cfg"
    (cfg / "dir.yaml").mkdir(parents=True)
    os.mkfifo(cfg / "fifo.yaml")  # a read would block forever: no writer
    (cfg / "zero.yaml").symlink_to("/dev/zero")  # inside the project by name, a device by nature
    for name, kind in (("dir", "a directory"), ("fifo", "a FIFO"), ("zero", "a character device")):
        blamed = cfg / f"{name}.yaml"
        assert f"is {kind}, not a regular file" in str(_refused(blamed, None)), name
        top = _write(cfg / f"top-{name}.yaml", f"include: [{name}.yaml]\n")
        # included: the same refusal, or (a link to /dev/zero) one for leaving the project
        with pytest.raises(ConfigFileError, match=f"is {kind}|outside the project"):
            read_yaml(top)


def test_size_and_encoding(tmp_path):
    big = _write(tmp_path / "big.yaml", "a: '" + "x" * 1_000_000 + "'\n")  # valid YAML, over 1 MB
    _refused(big, None, "larger than the 1.0 MB a config file may be")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: \xff\n")
    _refused(latin, None, "not UTF-8")
    missing = tmp_path / "missing.yaml"
    _refused(missing, None, "file not found")


def test_includes_stay_in_the_project_and_ordinary_ones_still_work(tmp_path):
    project = tmp_path / "project"
    (project / "targets").mkdir(parents=True)
    _write(project / "gates.yaml", "version: 1\n")
    _write(project / "common" / "base.yaml", "a: 1\nb: 1\n")
    top = _write(project / "eval_suites" / "s.yaml", "include: [../common/base.yaml]\nb: 2\n")
    assert read_yaml(top)[0] == {"a": 1, "b": 2}  # a sibling folder of the project: allowed
    (project / "eval_suites" / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    _write(tmp_path / "outside.yaml", "a: 1\n")
    top.write_text("include: [link.yaml]\n")
    _refused(top, 1, "outside the project")


def test_a_diamond_of_includes_is_bounded(tmp_path):
    # each file includes the next twice: 2^40 reads without a budget
    for i in range(40):
        _write(tmp_path / f"f{i}.yaml", f"include: [f{i + 1}.yaml, f{i + 1}.yaml]\n")
    _write(tmp_path / "f40.yaml", "a: 1\n")
    with pytest.raises(ConfigFileError, match="at most 32 files"):
        read_yaml(tmp_path / "f0.yaml")


def test_non_finite_floats_are_refused_by_the_models_too():
    """Values that do not come from YAML (a dict, the environment) meet the same rule."""
    for model, data in (
        (Floor, {"suite": "wikitext", "metric": "kld_mean", "max": float("inf")}),
        (Floor, {"suite": "wikitext", "metric": "kld_mean", "max": float("nan")}),
        (SandboxLimits, {"timeout_s": float("inf")}),
        (RegistrySettings, {"pull_cache_max_gb": float("inf")}),
        (RegistrySettings, {"transfer": {"read_timeout_s": float("nan")}}),
    ):
        with pytest.raises(ValueError, match="finite number"):
            model.model_validate(data)


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_a_non_finite_floor_is_refused_naming_its_line(repo_root, catalog, tmp_path, value):
    text = (repo_root / "gates.yaml").read_text()
    assert "metric: kld_mean, max: 0.05}" in text
    path = _write(
        tmp_path / "gates.yaml",
        text.replace("metric: kld_mean, max: 0.05}", f"metric: kld_mean, max: {value}}}", 1),
    )
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if f"max: {value}" in row)
    with pytest.raises(
        ConfigFileError, match=f"{re.escape(str(path))}:{line}: '{re.escape(value)}' is not a finite number"
    ):
        load_gates(path, catalog)


def test_the_gate_refuses_a_nan_floor_in_one_line_and_writes_nothing(repo_root, tmp_path):
    """Before: the gate decided with the NaN floor, then died writing report.json (traceback, exit 1)."""
    gates = _write(
        tmp_path / "gates.yaml", (repo_root / "gates.yaml").read_text().replace("max: 0.05}", "max: .nan}", 1)
    )
    out = tmp_path / "out"
    run = cli(
        "gate",
        "--results",
        str(E1),
        "--gates",
        str(gates),
        "--out",
        str(out),
        "--model-class",
        "dense-reasoner",
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {gates}:") and "not a finite number" in lines[0]
    assert not out.exists()


def test_the_gate_refuses_a_fifo_for_gates_without_hanging(tmp_path):
    fifo = tmp_path / "gates.yaml"
    os.mkfifo(fifo)
    run = cli("gate", "--results", str(E1), "--gates", str(fifo), "--out", str(tmp_path / "out"), timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == f"error: {fifo}: is a FIFO, not a regular file. Fix: point at a YAML file"


def test_an_alias_bomb_recipe_is_refused_when_its_target_is_read(repo_root, tmp_path):
    """The recipe of a target: 1.2 kB of nested aliases, refused before any plan is written."""
    from quantgate.config.targets import Catalog

    root = tmp_path / "project"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, root / part)
    recipe = root / "recipes" / "fp8-dynamic.yaml"
    assert recipe.read_text().rstrip().splitlines()[-1].startswith("        ignore:")  # recipe: is last
    # a second stage of the engine's own recipe (passed through as data, unvalidated)
    stage = "  bomb:\n" + "".join(f"    {line}\n" for line in BOMB.splitlines())
    recipe.write_text(recipe.read_text() + stage)
    with pytest.raises(ConfigFileError, match=f"{re.escape(str(recipe))}:\\d+: its aliases expand"):
        Catalog(root).target("hopper-fp8")


def test_a_suite_with_an_infinite_sandbox_timeout_is_refused_naming_its_line(repo_root, tmp_path):
    """Before: accepted, then every HumanEval item crashed mid-evaluation (math.ceil(inf))."""
    from quantgate.evaluate.suites import load_suite

    text = (repo_root / "eval_suites" / "humaneval.yaml").read_text()
    assert "sandbox: {timeout_s: 10," in text
    path = _write(
        tmp_path / "eval_suites" / "humaneval.yaml", text.replace("timeout_s: 10,", "timeout_s: .inf,")
    )
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if "timeout_s: .inf" in row)
    with pytest.raises(
        ConfigFileError, match=f"{re.escape(str(path))}:{line}: '.inf' is not a finite number"
    ):
        load_suite(path)


@pytest.mark.parametrize(
    ("field", "value"), [("timeout_s", "1e12"), ("memory_mb", "10000000"), ("max_processes", "100000")]
)
def test_sandbox_limits_beyond_what_a_kernel_takes_are_refused_naming_their_line(
    repo_root, tmp_path, field, value
):
    """Before: a finite but huge timeout (1e12 s) crashed the sandbox's timer with OverflowError."""
    from quantgate.evaluate.suites import load_suite

    text = (repo_root / "eval_suites" / "humaneval.yaml").read_text()
    default = {"timeout_s": "10", "memory_mb": "512", "max_processes": "16"}[field]
    path = _write(
        tmp_path / "eval_suites" / "humaneval.yaml", text.replace(f"{field}: {default}", f"{field}: {value}")
    )
    with pytest.raises(ConfigFileError, match=f"{re.escape(str(path))}:\\d+: .*less than or equal"):
        load_suite(path)
