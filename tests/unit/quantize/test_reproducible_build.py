"""Identical inputs give identical artifacts, calibration included, across processes.

A verdict is about bytes: if a rebuild of the same checkpoint, recipes and calibration set gave
other scales, the artifact served after a rebuild would not be the one gated. Each build runs in
its own process, so nothing cached in memory (a loaded model, a tokenized set) is shared.
"""

from __future__ import annotations

import json

import pytest

from support.cli import quantgate

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

TARGETS = "hopper-fp8,blackwell-nvfp4,draft-int4"  # data-free + KV pass, and both calibrated engines


def test_two_builds_in_separate_processes_write_the_same_bytes(tiny_llama, tmp_path):
    files = {}
    for run in ("a", "b"):
        done = quantgate(
            "build", "--checkpoint", str(tiny_llama), "--targets", TARGETS, "--out", str(tmp_path / run)
        )
        assert done.returncode == 0, done.stderr[-3000:]
        files[run] = {
            target: json.loads((tmp_path / run / target / "manifest.json").read_text())["files"]
            for target in TARGETS.split(",")
        }
    for target in TARGETS.split(","):
        assert files["a"][target] == files["b"][target], (
            target
        )  # every file's sha256, weights and scales included
        for name in files["a"][target]:
            assert (tmp_path / "a" / target / name).read_bytes() == (
                tmp_path / "b" / target / name
            ).read_bytes()
