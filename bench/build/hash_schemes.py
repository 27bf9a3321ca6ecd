"""The source content hash's schemes side by side: plain sha256 (one core per file), the SHA-256
merkle over 16 KiB blocks (quantgate.runtime.hashing.merkle_file, subtrees on threads) and BLAKE3 (the
``blake3`` wheel, its own threads), on one file of SIZE_GB (a checkpoint in one shard, the case
that ran on one core) with 1 and 2 workers. The file is read once first, so the page cache holds it
and the figures are the hash's, not the disk's.

Usage:  .venv/bin/python bench/build/hash_schemes.py [--gb 2] [--dir /tmp] [--workers 1 2]
(``blake3`` is a dependency of quantgate since issue 47.)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from quantgate.runtime.hashing import blake3_file, merkle_file, sha256_file


def _timed(fn) -> tuple[float, str]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    size = int(args.gb * 1024**3)
    path = Path(args.dir) / "quantgate-hash-bench.bin"
    block = os.urandom(64 * 1024 * 1024)
    with open(path, "wb") as fh:
        fh.writelines(block[: min(len(block), size - start)] for start in range(0, size, len(block)))
    try:
        with open(path, "rb") as fh:  # into the page cache
            while fh.read(64 * 1024 * 1024):
                pass
        rows = []
        for workers in args.workers:
            cases = {"merkle-16k": lambda w=workers: merkle_file(path, workers=w).sha256}
            if workers == 1:
                cases["sha256"] = lambda: sha256_file(path).sha256
            try:
                import blake3  # noqa: F401

                cases["blake3"] = lambda w=workers: blake3_file(path, workers=w).sha256
            except ImportError:
                print("blake3: not installed, skipped")
            for name, fn in cases.items():
                seconds, _ = _timed(fn)
                rows.append(
                    {
                        "scheme": name,
                        "workers": workers,
                        "s": round(seconds, 2),
                        "GB/s": round(size / seconds / 1e9, 2),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        print(json.dumps({"bytes": size, "cores": os.cpu_count(), "rows": rows}))
    finally:
        path.unlink()


if __name__ == "__main__":
    main()
