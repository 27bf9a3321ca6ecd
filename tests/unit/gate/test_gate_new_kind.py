"""A suite kind from outside quantgate, gated with no code under quantgate/gate knowing it.

The kind is a module written into tmp_path and announced the way an installed package would
announce it: a ``*.dist-info`` with an ``entry_points.txt`` in the ``quantgate.suite_kinds``
group, on sys.path. The project (suite YAML, gates.yaml) and the evaluation output are files
in tmp_path too; the gate reads the new kind's metrics, directions and columns from the registry.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.declarations import SUITE_KINDS
from quantgate.evaluate.suites import KINDS
from quantgate.gate.run import gate_results
from quantgate.runtime.errors import ConfigFileError
from support.cli import quantgate

pytestmark = pytest.mark.unit

KIND_MODULE = '''
"""A rubric-graded suite: every item gets a score in [0, 1]; the gate pairs items with the source."""

from typing import Literal

import numpy as np
from pydantic import PositiveInt

from quantgate.config.targets import Frozen
from quantgate.evaluate.suites import SuiteKind, SuiteSpec
from quantgate.declarations.metrics import Metric, Sums, mean, mean_sums, ones


class RubricSizes(Frozen):
    items: PositiveInt


class RubricSpec(SuiteSpec):
    kind: Literal["rubric"]
    profiles: dict[str, RubricSizes]


def _lost(a, s, axis):
    return np.mean(np.maximum(s["score"] - a["score"], 0.0), axis=axis)


class RubricSuite(SuiteKind):
    spec_model = RubricSpec

    def metrics(self):
        return {
            # each metric declares its per-item form (here a mean, as sums), which the gate bounds
            "rubric_score": Metric(
                True, True, "mean rubric score per item", mean("score"), sums=mean_sums("score")
            ),
            "score_lost": Metric(
                False,
                False,
                "mean score lost against the source, per item",
                _lost,
                sums=Sums(lambda a, s: np.maximum(s["score"] - a["score"], 0.0), ones, (0.0, 1.0)),
            ),
        }

    def columns(self, sample):
        return {"score": float(sample["score"])}

    def reference(self, ctx, source):
        raise NotImplementedError("this kind is only gated here; quantgate eval is not run")

    def score(self, ctx, model, reference):
        raise NotImplementedError("this kind is only gated here; quantgate eval is not run")
'''

SUITE = """\
name: rubric
kind: rubric
description: answers graded by a rubric
profiles: {smoke: {items: 128}, full: {items: 400}}
metrics: [rubric_score, score_lost]
"""

GATES = """\
version: 1
model_classes:
  any:
    description: every checkpoint
    match: {}
    targets: {required: [hopper-fp8], optional: [rocm-cdna3-fp8]}
    kv_cache: bf16
tenants:
  graders:
    description: keep the rubric score
    floors:
      - {suite: rubric, metric: rubric_score, min_recovery: 0.9}
      - {suite: rubric, metric: score_lost, max: 0.05}
"""


def _plugin(directory: Path) -> Path:
    """The kind's module and the metadata an installed distribution would carry."""
    directory.mkdir()
    (directory / "rubric_kind.py").write_text(KIND_MODULE)
    info = directory / "quantgate_rubric-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: quantgate-rubric\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[quantgate.suite_kinds]\nrubric = rubric_kind:RubricSuite\n")
    return directory


def _result(scores: np.ndarray) -> dict:
    """One model's result file, as quantgate eval writes it (E/<model>/<suite>.json)."""
    samples = [{"item": i, "score": float(x)} for i, x in enumerate(scores)]
    return {
        "suite": "rubric",
        "kind": "rubric",
        "metrics": {"rubric_score": float(np.mean(scores))},
        "samples": samples,
        "notes": [],
    }


@pytest.fixture
def world(tmp_path, repo_root, monkeypatch):
    plugins = _plugin(tmp_path / "plugins")
    monkeypatch.syspath_prepend(str(plugins))
    for registry in (KINDS, SUITE_KINDS):  # the kind is forgotten after the test
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    project = tmp_path / "project"
    shutil.copytree(repo_root / "targets", project / "targets")
    (project / "eval_suites").mkdir()
    (project / "eval_suites" / "rubric.yaml").write_text(SUITE)
    (project / "gates.yaml").write_text(GATES)

    rng = np.random.default_rng(3)
    source = rng.uniform(0.5, 1.0, 128)
    results = tmp_path / "E"
    models = {
        "source": source,
        "hopper-fp8": source - rng.uniform(0, 0.01, 128),  # within the floors
        "rocm-cdna3-fp8": source * 0.6,
    }  # loses 40% of every item's score
    for model, scores in models.items():
        (results / model).mkdir(parents=True)
        (results / model / "rubric.json").write_text(json.dumps(_result(scores)))
    (results / "summary.json").write_text("{}")
    return {"plugins": plugins, "project": project, "results": results}


def test_a_kind_from_an_entry_point_is_gated_by_its_own_metrics(world):
    project = world["project"]
    report = gate_results(world["results"], project / "gates.yaml", project, model_class="any")
    good, bad = (
        next(v for v in report.verdicts if v.artifact == a) for a in ("hopper-fp8", "rocm-cdna3-fp8")
    )
    assert good.verdict == "pass" and [f.status for f in good.floors] == ["pass", "pass"]
    assert all(f.interval == "betting" and f.items == 128 for f in good.floors)
    recovery, lost = bad.floors
    assert recovery.status == "fail" and recovery.estimate == pytest.approx(0.6)
    assert lost.status == "fail" and "> max 0.05: FAIL" in lost.reason
    assert "mean score lost against the source, per item; covers:" in lost.reason  # the kind's own words
    assert report.approvals == {"hopper-fp8": ["graders"], "rocm-cdna3-fp8": []} and report.exit_code == 0


def test_the_kinds_declarations_validate_gates_yaml(world):
    project = world["project"]
    path = project / "gates.yaml"
    path.write_text(GATES.replace("metric: score_lost, max: 0.05", "metric: score_lost, min_recovery: 0.9"))
    with pytest.raises(ConfigFileError, match="score_lost is lower-is-better"):
        load_gates(path, Catalog(project))
    path.write_text(GATES.replace("metric: rubric_score,", "metric: rubric_scor,"))
    with pytest.raises(
        ConfigFileError,
        match=r"unknown metric for suite 'rubric' \(kind rubric\) 'rubric_scor' "
        r"\(did you mean 'rubric_score'\?\)",
    ):
        load_gates(path, Catalog(project))


@pytest.mark.heavy
def test_quantgate_gate_finds_the_kind_in_a_fresh_process(world, tmp_path):
    plugins = os.pathsep.join(filter(None, [str(world["plugins"]), os.environ.get("PYTHONPATH")]))
    run = quantgate(
        "gate", "--results", str(world["results"]), "--out", str(tmp_path / "R"),
        "--root", str(world["project"]), "--model-class", "any",
        env={"PYTHONPATH": plugins}, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "R" / "report.json").read_text())
    assert report["approvals"] == {"hopper-fp8": ["graders"], "rocm-cdna3-fp8": []}
