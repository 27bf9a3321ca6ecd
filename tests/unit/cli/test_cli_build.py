"""The command line as CI calls it: exit codes, messages on stderr, nothing written on bad input."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.heavy
def test_bad_checkpoint_exits_2_names_the_file_and_writes_nothing(cli, tiny_llama, tmp_path):
    (tiny_llama / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    out = tmp_path / "out"
    run = cli("build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out))
    assert run.returncode == 2
    assert "pytorch_model.bin" in run.stderr and "Fix:" in run.stderr
    assert "Traceback" not in run.stderr
    assert not out.exists()


@pytest.mark.heavy
def test_unknown_target_suggests_the_nearest(cli, tiny_llama, tmp_path):
    run = cli(
        "build", "--checkpoint", str(tiny_llama), "--targets", "hoper-fp8", "--out", str(tmp_path / "o")
    )
    assert run.returncode == 2
    assert "did you mean 'hopper-fp8'" in run.stderr
    assert not (tmp_path / "o").exists()


def test_usage_error_exits_2(cli):
    run = cli("build", "--no-such-option")
    assert run.returncode == 2
    assert "No such option" in run.stderr


@pytest.mark.heavy
def test_build_prints_a_table_and_exits_0(cli, tiny_llama, tmp_path):
    run = cli(
        "build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(tmp_path / "o")
    )
    assert run.returncode == 0, run.stderr
    assert "hopper-fp8" in run.stdout and "built" in run.stdout
    assert (tmp_path / "o" / "hopper-fp8" / "manifest.json").exists()


@pytest.mark.heavy
def test_a_build_keeps_its_cache_in_cache_dir(cli, tiny_llama, tmp_path):
    # the FP8 engine's quantization-config memo once went to $QUANTGATE_CACHE whatever --cache-dir said
    user_cache = tmp_path / "user-cache"
    env = {"QUANTGATE_CACHE": str(user_cache)}
    run = cli(
        "build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(tmp_path / "o"),
        "--cache-dir", str(tmp_path / "run-cache"), env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert list((tmp_path / "run-cache" / "stream_fp8").glob("quantization_config-*.json"))
    assert not user_cache.exists() or not any(user_cache.rglob("*"))


@pytest.mark.heavy
def test_a_max_memory_that_is_no_size_is_refused_before_any_work(cli, tiny_llama, tmp_path):
    out = tmp_path / "out"
    run = cli(
        "build", "--checkpoint", str(tiny_llama), "--targets", "blackwell-nvfp4", "--max-memory", "lots",
        "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 2
    assert "--max-memory" in run.stderr and "40GB" in run.stderr
    assert not out.exists()
