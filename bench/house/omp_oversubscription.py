"""Torch processes sharing a CPU: what OpenMP's spinning threads cost (the test suite's workers).

Usage:  .venv/bin/python bench/house/omp_oversubscription.py

A decode-sized loop (576x1536 and 1536x576 linears at 4 tokens, as the default model generates)
and a prefill-sized one (2,048 tokens), each timed in a fresh process: alone at the default
thread count, then two processes at once with the default count, with ``OMP_WAIT_POLICY=PASSIVE``
and with ``OMP_NUM_THREADS=1``. Printed as JSON: seconds per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

LOOP = """
import time, torch
torch.manual_seed(0)
x = torch.randn({tokens}, 576)
w1, w2 = torch.randn(1536, 576), torch.randn(576, 1536)
def step():
    for _ in range({repeat}):
        y = torch.nn.functional.linear(torch.nn.functional.linear(x, w1).relu(), w2)
        torch.nn.functional.layer_norm(y, (576,))
step()
t = time.perf_counter()
for _ in range(3):
    step()
print(time.perf_counter() - t)
"""
SHAPES = {"decode": {"tokens": 4, "repeat": 3000}, "prefill": {"tokens": 2048, "repeat": 40}}
SETTINGS = {
    "alone": (1, {}),
    "two, default threads": (2, {}),
    "two, OMP_WAIT_POLICY=PASSIVE": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "two, OMP_NUM_THREADS=1": (2, {"OMP_NUM_THREADS": "1"}),
}


def _seconds(code: str, processes: int, env: dict[str, str]) -> list[float]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    return [round(float(p.communicate()[0]), 2) for p in procs]


def main() -> None:
    import torch

    result = {"cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads()}
    for shape, sizes in SHAPES.items():
        code = LOOP.format(**sizes)
        result[shape] = {name: _seconds(code, n, env) for name, (n, env) in SETTINGS.items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
