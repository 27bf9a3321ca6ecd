"""The canary replay's prompts through ``quantgate eval``: the figures beside the llama.cpp replay.

Usage:  .venv/bin/python bench/fleet/replay_prompts_eval.py --artifacts DIR [--targets draft-int4]
            [--size 12] [--seed 0] [--out F]

``bench/fleet/canary_replay.py`` replays ``--size`` prompts (seed 0, the default calibration spec's
traffic mix) through two llama.cpp servers. This script takes the *same* prompts (the sample
``quantgate replay`` draws, ``quantgate.cli.replay._prompts``) and scores them with the product's
own command: it writes them as a corpus in a data directory, declares a ``text`` suite on that
file (the house's suite kind for a corpus: seeded windows, KL to the source and top-1 agreement,
teacher-forced) in a project directory whose ``eval_suites/`` adds it to the checkout's suites
(targets, recipes, gates and calibration are the checkout's, linked), and runs ``quantgate eval --suites
replay-prompts`` on the artifacts ``quantgate build`` made. Printed: each target's token-weighted
top-1 agreement and mean KL against the source, the windows, and the command's wall time.

What differs from the replay, by design: eval scores next-token distributions on the prompts'
own text (every position, teacher-forced), the replay compares the greedy continuations after
each prompt (top-5 on each side); and the artifacts are quantgate's targets (draft-int4: W4A16
GPTQ group 64; hopper-fp8), not llama.cpp's Q4_1 and Q4_0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 64  # as the text suites' smoke profile


def suite_yaml(sha256: str, windows: int) -> str:
    """A text suite on the prompts file: ``windows`` windows of ``SEQ_LEN`` tokens."""
    return (
        "version: 1\nname: replay-prompts\nkind: text\n"
        "description: the canary replay's sampled prompts (bench/fleet/replay_prompts_eval.py)\n"
        f"seed: 0\ndata: {{local: replay-prompts/prompts.txt, sha256: {sha256}}}\ntop_k: 32\n"
        f"profiles:\n  smoke: {{tokens: {windows * SEQ_LEN}, seq_len: {SEQ_LEN}, batch_size: 16}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )


def project(tmp: Path, text: str, windows: int) -> tuple[Path, Path]:
    """(project root, data dir): the checkout's config linked, one suite declared."""
    data = tmp / "data"
    (data / "replay-prompts").mkdir(parents=True)
    (data / "replay-prompts" / "prompts.txt").write_text(text, encoding="utf-8")
    root = tmp / "project"
    (root / "eval_suites").mkdir(parents=True)
    for name in ("targets", "recipes", "gates.yaml", "calibration_sets", "pyproject.toml"):
        (root / name).symlink_to(REPO / name)
    for suite in (REPO / "eval_suites").glob("*.yaml"):  # gates.yaml's floors name them
        (root / "eval_suites" / suite.name).symlink_to(suite)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    (root / "eval_suites" / "replay-prompts.yaml").write_text(suite_yaml(sha, windows))
    return root, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifacts", type=Path, required=True, help="quantgate build --out")
    parser.add_argument("--targets", default="draft-int4")
    parser.add_argument("--size", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", type=int, default=128, help="windows of 64 tokens drawn")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from quantgate.cli.replay import _prompts  # the sample `quantgate replay` draws
    from quantgate.rollout.replay_compare import prompt_sha256

    prompts = _prompts(REPO / "calibration_sets" / "default.yaml", [], args.size, args.seed)
    with tempfile.TemporaryDirectory(prefix="quantgate-replay-eval-") as tmp:
        root, data = project(Path(tmp), "\n\n".join(prompts), args.windows)
        out = Path(tmp) / "eval"
        cmd = [str(REPO / ".venv" / "bin" / "quantgate"), "eval", "--artifacts", str(args.artifacts)]
        cmd += ["--out", str(out), "--suites", "replay-prompts", "--targets", args.targets]
        cmd += ["--data-dir", str(data), "--root", str(root), "--fixed"]
        start = time.perf_counter()
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=root)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"quantgate eval exited {done.returncode}:\n{done.stderr[-4000:]}")
        summary = json.loads((out / "summary.json").read_text())
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "prompts": [prompt_sha256(p) for p in prompts],
        "windows": args.windows,
        "seq_len": SEQ_LEN,
        "command": " ".join(cmd[1:]),
        "wall_s": round(wall, 1),
        "summary": summary,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
