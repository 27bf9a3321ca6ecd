"""The wheels a device image lacks for quantgate's build and evaluation, pinned to this environment.

Usage:  .venv/bin/python bench/gpu/device_wheels.py IMAGE_PACKAGES.txt ROOT... > wheels.txt
then    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl -r wheels.txt     (sdist-only ones, e.g. rouge-score: .venv/bin/pip wheel --no-deps -w .whl)

IMAGE_PACKAGES.txt: the device image's package names, comma-separated (the list in the device tool's
KINDS.md). Walks ROOT's requirements (extras off) in this virtual environment and prints
``name==version`` for every distribution not in the image (a ROOT is printed even when the image
has it: its version here is the one tested). Issue 27's device calls used the roots
``pydantic compressed-tensors llmcompressor lm-eval datasets transformers tokenizers
huggingface-hub gguf accelerate`` (34 MB of wheels; py-spy added for profiling).
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    listed = Path(sys.argv[1]).read_text().strip().rstrip(".")
    image = {_norm(x) for x in re.split(r",\s*", listed)}
    roots = [_norm(r) for r in sys.argv[2:]]
    seen: set[str] = set()
    need: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = _norm(stack.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            print(f"not installed here: {name}", file=sys.stderr)
            continue
        if name in image and name not in roots:
            continue
        need[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    for name, version in sorted(need.items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
