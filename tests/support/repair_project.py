"""A project for repair tests: the repository's targets, recipes and calibration sets, one small
text suite on a local corpus, and a gates.yaml whose floors a test sets from measured values."""

from __future__ import annotations

import shutil
from pathlib import Path

TARGET = "blackwell-nvfp4"
GATES = """version: 1
model_classes:
  any:
    description: every model
    match: {{}}
    targets: {{required: [{target}]}}
    kv_cache: bf16
repair: {{max_evaluations: {budget}}}
tenants:
  loose:
    description: half the uniform artifact's divergence
    repair: true
    floors:
      - {{suite: tiny-text, metric: kld_mean, max: {loose}}}
  impossible:
    description: no divergence at all a quantized model can reach
    repair: true
    floors:
      - {{suite: tiny-text, metric: kld_mean, max: {impossible}}}
  unrepaired:
    description: fails, and is not marked for repair
    floors:
      - {{suite: tiny-text, metric: kld_mean, max: {impossible}}}
"""


def write_gates(project: Path, loose: float, impossible: float, budget: int = 6) -> Path:
    path = project / "gates.yaml"
    path.write_text(GATES.format(target=TARGET, budget=budget, loose=loose, impossible=impossible))
    return path


def make_project(root: Path, repo_root: Path) -> Path:
    """The project under ``root``, floors at 1.0 until a test sets them."""
    for part in ("targets", "recipes", "calibration_sets"):
        shutil.copytree(repo_root / part, root / part)
    (root / "data").mkdir()
    (root / "data" / "corpus.txt").write_text(
        " ".join(f"Item {i} comes after item {i - 1}." for i in range(1200))
    )
    (root / "eval_suites").mkdir()
    (root / "eval_suites" / "tiny-text.yaml").write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        # 64 windows: the gate's betting test needs about 40 before even a perfect copy can pass
        "profiles: {smoke: {tokens: 2048, seq_len: 32, batch_size: 16}, full: {tokens: 2048, seq_len: 32}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )
    write_gates(root, 1.0, 1.0)
    return root
