"""``--device``: auto is CUDA where torch sees a GPU, else the CPU; cuda without one is refused."""

from __future__ import annotations

import pytest

from quantgate.runtime import devices
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("present", "asked", "got"), [(True, "auto", "cuda"), (False, "auto", "cpu"),
                                                      (True, None, "cuda"), (True, "cpu", "cpu"),
                                                      (True, "CUDA", "cuda"), (False, "cpu", "cpu")])  # fmt: skip
def test_auto_takes_the_gpu_where_there_is_one(monkeypatch, present, asked, got):
    monkeypatch.setattr(devices, "cuda_available", lambda: present)
    assert devices.resolve(asked) == got


def test_cuda_without_a_gpu_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(InputError, match="--device: cuda was asked for"):
        devices.resolve("cuda")
    with pytest.raises(InputError, match="not a device"):
        devices.resolve("tpu")


@pytest.mark.heavy
@pytest.mark.parametrize("command", ["build", "eval", "repair"])
def test_the_cli_refuses_cuda_without_a_gpu_before_any_work(command, tmp_path):
    import torch

    from support.cli import quantgate

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    extra = {
        "eval": ["--artifacts", str(tmp_path)],
        "repair": ["--artifacts", str(tmp_path), "--results", str(tmp_path)],
    }
    extra = extra.get(command, [])
    done = quantgate(command, "--device", "cuda", "--out", str(tmp_path / "out"), *extra, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "cuda was asked for but torch sees no CUDA device" in done.stderr + done.stdout
    assert not (tmp_path / "out").exists()
