"""Deliberately damaged copies of the default model's FP8 artifact fail every tenant, on evidence.

Each copy is internally consistent (its manifest rewritten over the damaged bytes), so only the
evaluation can catch it: noisy weights, perturbed weight scales, one destroyed layer, and KV-cache
scales that clip keys and values. Evaluated on the text suites (wikitext and traffic: every tenant
of an FP8 target has a floor on one of them; the other suites are left out for time, so their
floors are "missing"), each must fail every tenant with a measured floor among the reasons,
never only for lack of data.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantgate.artifact import hash_files, read_manifest, write_manifest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Damage = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor | None]
LAYER = 15  # of 30: the middle of the stack


def _noisy_weights(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if t.dtype != torch.float8_e4m3fn:
        return None
    noisy = t.float() * (1 + 0.5 * torch.randn(t.shape, generator=g))
    return noisy.clamp(-448, 448).to(t.dtype)


def _perturbed_scales(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.endswith("weight_scale"):
        return None
    return (t.float() * (1 + 0.6 * (2 * torch.rand(t.shape, generator=g) - 1))).to(t.dtype)


def _one_layer(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.startswith(f"model.layers.{LAYER}.") or t.dtype != torch.float8_e4m3fn:
        return None
    return t[torch.randperm(t.shape[0], generator=g)]  # its output channels scrambled


def _clipping_kv_scales(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.endswith(("k_scale", "v_scale")):
        return None
    return (t.float() / 16).to(t.dtype)  # keys and values saturate at 1/16 of their range


DAMAGES: dict[str, Damage] = {
    "weights": _noisy_weights,
    "scales": _perturbed_scales,
    "one-layer": _one_layer,
    "kv-scales": _clipping_kv_scales,
}


def _damaged_copy(artifact: Path, dest: Path, damage: Damage) -> None:
    shutil.copytree(artifact, dest)
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for shard in sorted(dest.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in sorted(tensors):
            damaged = damage(name, tensors[name], generator)
            if damaged is not None:
                tensors[name], changed = damaged, changed + 1
        shard.unlink()
        save_file(tensors, shard, metadata={"format": "pt"})
    assert changed, f"{dest.name}: the damage touched no tensor"
    write_manifest(dest, read_manifest(dest).model_copy(update={"files": hash_files(dest)}))


@pytest.fixture(scope="module")
def damaged_report(default_model, default_artifacts, tmp_path_factory, run_cli) -> dict:
    built, _ = default_artifacts
    artifacts = tmp_path_factory.mktemp("damaged")
    for kind, damage in DAMAGES.items():
        _damaged_copy(built / "hopper-fp8", artifacts / f"hopper-fp8-{kind}", damage)
    out = tmp_path_factory.mktemp("damaged-eval")
    args = ["--checkpoint", str(default_model), "--artifacts", str(artifacts), "--out", str(out)]
    evaluated = run_cli("eval", *args, "--suites", "wikitext,traffic")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = tmp_path_factory.mktemp("damaged-report")
    gated = run_cli("gate", "--results", str(out), "--out", str(report), "--model-class", "dense-reasoner")
    assert gated.returncode in (0, 1), gated.stderr[-3000:]
    return json.loads((report / "report.json").read_text())


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_a_damaged_artifact_fails_every_tenant_on_a_measured_floor(damaged_report, kind):
    verdicts = [v for v in damaged_report["verdicts"] if v["artifact"] == f"hopper-fp8-{kind}"]
    assert {v["tenant"] for v in verdicts} == {"chat", "reasoning", "batch", "support"}
    for v in verdicts:
        assert v["verdict"] == "fail", v
        measured = [f for f in v["floors"] if f["status"] == "fail"]
        assert measured, f"{kind} fails {v['tenant']} only for lack of data: {v['reasons']}"
    assert not damaged_report["approvals"].get(f"hopper-fp8-{kind}")
