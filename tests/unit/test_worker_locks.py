"""The GPU worker's lock against its image: what the wheelhouse carries and what it leaves to the image.

``requirements/worker-gpu.lock`` is resolved over the image's ``pip freeze``
(``requirements/worker-gpu-base.txt``, scripts/wheelhouse.sh lock with BASE): a package the image holds
at the locked version must not travel twice, the image's CUDA torch must never be replaced by a
wheel from the lock, and every requirement quantgate names must be met by one or the other, or the
worker's install fails offline, where nothing can be fetched to fix it.
"""

from __future__ import annotations

import re
from importlib.metadata import requires
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    lines = (line.strip() for line in path.read_text().splitlines() if not line.startswith("#"))
    return {_key(m[1]): m[2] for m in map(PIN.match, lines) if m}


def test_the_gpu_lock_carries_only_what_the_image_lacks():
    image, lock = _pins(REQUIREMENTS / "worker-gpu-base.txt"), _pins(REQUIREMENTS / "worker-gpu.lock")
    assert image and lock
    assert not [k for k, v in lock.items() if image.get(k) == v], "a package the image already holds travels"
    assert not {"torch", "triton"} & lock.keys(), "the lock would replace the image's CUDA torch"
    assert not [k for k in lock if k.startswith("nvidia-cu")], "the image's CUDA libraries are its own"


def test_every_requirement_of_quantgate_is_met_by_the_lock_or_the_image():
    image, lock = _pins(REQUIREMENTS / "worker-gpu-base.txt"), _pins(REQUIREMENTS / "worker-gpu.lock")
    direct = {
        _key(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0])
        for r in requires("quantgate") or []
        if "extra ==" not in r or 'extra == "gpu"' in r
    }
    assert "nvidia-modelopt" in direct and "mlflow" in direct
    assert not sorted(direct - lock.keys() - image.keys())


def test_every_lock_line_is_pinned_with_a_hash():
    for lock in ("worker-cpu.lock", "worker-gpu.lock"):
        for line in (REQUIREMENTS / lock).read_text().splitlines():
            if line and not line.startswith("#"):
                assert re.fullmatch(r"\S+==\S+ --hash=sha256:[0-9a-f]{64}", line), f"{lock}: {line}"
