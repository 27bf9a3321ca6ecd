"""What build and evaluation write, under hostile conditions (issue 15): an ``--out`` that cannot be
a directory, malformed manifests, a build killed with SIGKILL, a full disk, a build that fails.

Each case checks what a user would see: the exit code, one line naming the file and the fix, and
what is (not) left on disk afterwards. Hostile files are written here by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.contracts.artifact import MANIFEST, artifact_dirs, load_manifest
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.intake import intake
from quantgate.runtime.errors import DiskFullError, InputError
from support.artifacts import write_artifact
from support.builds import build_targets
from support.cli import quantgate as cli
from support.tmpfs import files_under, fill, small_tmpfs

pytestmark = pytest.mark.unit


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error")]


def _refused(run: subprocess.CompletedProcess[str], code: int, *named: str) -> str:
    """The one error line of a refused command, once its exit code and names are checked."""
    assert run.returncode == code, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    lines = _error_lines(run.stderr)
    assert len(lines) == 1, run.stderr[-3000:]
    for name in named:
        assert name in lines[0], lines[0]
    return lines[0]


# --- malformed manifests: exit 2 naming the file, whatever is in it


def _artifact(root: Path) -> Path:
    return write_artifact(
        root / "hopper-fp8",
        "hopper-fp8",
        {"model.safetensors": b"weights", "config.json": b"{}", "sub/tokenizer.json": b"{}"},
    )


def _edited(changes: Callable[[dict], None]) -> Callable[[str], bytes]:
    def edit(good: str) -> bytes:
        manifest = json.loads(good)
        changes(manifest)
        return json.dumps(manifest).encode()

    return edit


def _rename(name: str) -> Callable[[str], bytes]:
    return _edited(lambda m: m["files"].__setitem__(name, m["files"].pop("model.safetensors")))


HOSTILE_MANIFESTS: dict[str, tuple[Callable[[str], bytes], str]] = {
    "truncated": (lambda good: good[: len(good) // 2].encode(), "EOF while parsing"),
    "empty": (lambda good: b"", "EOF while parsing"),
    "a JSON list": (lambda good: b"[1, 2]", "Input should be an object"),
    "UTF-16": (lambda good: good.encode("utf-16"), "not UTF-8"),
    "nested 100,000 deep": (
        lambda good: b'{"target": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "recursion limit exceeded",
    ),
    "a number for the target": (_edited(lambda m: m.__setitem__("target", 5)), "target: Input should be"),
    "files as a list": (_edited(lambda m: m.__setitem__("files", ["model.safetensors"])), "files:"),
    "a size in words": (
        _edited(lambda m: m["files"]["config.json"].__setitem__("bytes", "many")),
        "files.config.json.bytes",
    ),
    "a field missing": (_edited(lambda m: m.pop("build_key")), "build_key: Field required"),
    "an unknown field": (_edited(lambda m: m.__setitem__("run_this", "rm -rf /")), "run_this"),
    "a '../' name": (_rename("../outside.bin"), "has a '..' part"),
    "an absolute name": (_rename("/etc/passwd"), "is absolute"),
    "a './' name": (_rename("./model.safetensors"), "not normalized"),
    "a 'a//b' name": (_rename("sub//model.safetensors"), "not normalized"),
    "a backslash": (_rename("..\\model.safetensors"), "backslash"),
    "a NUL": (_rename("model\0.safetensors"), "control character"),
}


@pytest.mark.parametrize("case", list(HOSTILE_MANIFESTS))
def test_a_malformed_manifest_is_bad_input_naming_the_file(tmp_path, case):
    make, problem = HOSTILE_MANIFESTS[case]
    artifact = _artifact(tmp_path)
    manifest = artifact / MANIFEST
    manifest.write_bytes(make(manifest.read_text()))
    with pytest.raises(InputError) as caught:
        load_manifest(artifact)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert message.startswith(f"{manifest}: ") and problem in message and "Fix:" in message
    assert "\n" not in message and len(message) < 400  # the content is never echoed
    with pytest.raises(InputError, match="not a valid artifact manifest|not UTF-8"):
        artifact_dirs(tmp_path)  # what evaluation discovers: refused, not skipped


def test_a_manifest_that_is_no_regular_file_is_refused_without_reading_it(tmp_path):
    artifact = _artifact(tmp_path)
    (artifact / MANIFEST).unlink()
    os.mkfifo(artifact / MANIFEST)  # reading it would wait for a writer forever
    with pytest.raises(InputError, match="not a regular file"):
        load_manifest(artifact)
    (artifact / MANIFEST).unlink()
    (artifact / MANIFEST).symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError, match="dangling"):
        artifact_dirs(tmp_path)


def test_a_manifest_over_the_size_limit_is_not_read_whole(tmp_path, monkeypatch):
    import quantgate.contracts.artifact

    artifact = _artifact(tmp_path)
    monkeypatch.setattr(quantgate.contracts.artifact, "MAX_MANIFEST_BYTES", 1000)
    (artifact / MANIFEST).write_bytes(b" " * 1001)
    with pytest.raises(InputError, match="larger than 1000 bytes"):
        load_manifest(artifact)


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("case", "damage", "named"),
    [
        ("truncated", lambda a: (a / MANIFEST).write_text((a / MANIFEST).read_text()[:300]), "EOF"),
        (
            "'../' name",
            lambda a: (a / MANIFEST).write_bytes(_rename("../x")((a / MANIFEST).read_text())),
            "..",
        ),
        ("missing file", lambda a: (a / "config.json").unlink(), "config.json: missing"),
    ],
)
def test_eval_refuses_a_malformed_manifest_with_exit_2_and_writes_nothing(
    tiny_llama, tmp_path, case, damage, named
):
    artifacts = tmp_path / "artifacts"
    damage(_artifact(artifacts))
    out = tmp_path / "eval"
    run = cli(
        "eval",
        "--checkpoint",
        str(tiny_llama),
        "--artifacts",
        str(artifacts),
        "--out",
        str(out),
        "--suites",
        "wikitext",
    )
    _refused(run, 2, str(artifacts / "hopper-fp8" / MANIFEST), named, "Fix:")
    assert not out.exists()


# --- --out that cannot be a directory: exit 2 naming it, before any work


@pytest.mark.heavy
@pytest.mark.parametrize("command", ["build", "build under", "eval", "gate"])
def test_out_naming_an_existing_file_is_exit_2_naming_it(tiny_llama, tmp_path, command):
    taken = tmp_path / "taken"
    taken.write_text("keep me\n")
    _artifact(tmp_path / "artifacts")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text("{}\n")
    args = {
        "build": ["build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(taken)],
        "build under": ["build", "--targets", "hopper-fp8", "--out", str(taken / "artifacts")],
        "eval": ["eval", "--artifacts", str(tmp_path / "artifacts"), "--out", str(taken)],
        "gate": ["gate", "--results", str(tmp_path / "results"), "--out", str(taken)],
    }[command]
    line = _refused(cli(*args), 2, str(taken), "--out", "existing file", "Fix:")
    assert "move the file away" in line
    assert taken.read_text() == "keep me\n"


# --- a build killed with SIGKILL: its leftover is removed by the next, never taken for an artifact


@pytest.fixture(scope="module")
def calibration(repo_root):
    return build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))


def _tiny_text_suite(tmp_path: Path, repo_root: Path, cache: Path) -> tuple[list, EvalContext]:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "corpus.txt").write_text(
        " ".join(f"Item {i} follows item {i - 1}." for i in range(200))
    )
    spec = tmp_path / "suites" / "tiny-text.yaml"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        "profiles: {smoke: {tokens: 128, seq_len: 64, batch_size: 2}, full: {tokens: 128, seq_len: 64}}\n"
        "metrics: [perplexity, kld_mean]\n"
    )
    return [load_suite(spec)], EvalContext("smoke", DataDir((tmp_path / "data",)), repo_root, cache)


@pytest.mark.heavy
def test_a_killed_build_leaves_a_leftover_that_the_next_build_removes_and_eval_never_sees(
    tiny_llama, tmp_path, catalog, repo_root
):
    out = tmp_path / "artifacts"
    args = ["build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out)]
    build = subprocess.Popen(
        [sys.executable, "-m", "quantgate.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline, leftover = time.monotonic() + 600, None
    while leftover is None:
        assert build.poll() is None, "the build ended before its temporary directory appeared"
        assert time.monotonic() < deadline, "no temporary directory within 10 minutes"
        leftover = next(out.glob(".hopper-fp8.tmp-*"), None) if out.is_dir() else None
        time.sleep(0.01)
    os.kill(build.pid, signal.SIGKILL)
    build.wait()
    assert leftover.is_dir()  # SIGKILL runs no cleanup
    assert not (out / "hopper-fp8").exists()

    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["hopper-fp8"]  # the leftover is gone
    assert artifact_dirs(out) == [out / "hopper-fp8"]

    # a live build's temporary copy (manifest and all) and a stray directory are no artifacts
    shutil.copytree(out / "hopper-fp8", out / f".hopper-fp8.tmp-{os.getpid()}-0a1b")
    (out / "notes").mkdir()
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    suites, ctx = _tiny_text_suite(tmp_path, repo_root, tmp_path / "cache")
    run = evaluate(Path(record.path), record.content_hash, out, tmp_path / "eval", suites, ctx)
    assert set(run.summary) == {"source", "hopper-fp8"}


# --- a full disk: exit 75, one line, nothing partial


@pytest.mark.heavy
def test_a_full_disk_during_build_is_exit_75_in_one_line_and_leaves_nothing(tiny_llama, tmp_path):
    with small_tmpfs(tmp_path / "fs", 64) as fs:
        out = fs / "artifacts"
        run = cli("build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out))
        _refused(run, 75, str(out / "hopper-fp8"), "ENOSPC", "building hopper-fp8", "free space and re-run")
        assert list(fs.iterdir()) == []  # no half artifact, no temporary directory, no empty --out


@pytest.mark.heavy
def test_a_full_disk_keeps_an_existing_out_and_its_artifacts(
    tiny_llama, tmp_path, catalog, repo_root, calibration
):
    """--out existed before: it stays, with the older artifact the failed rebuild would have
    replaced, and gets nothing half-written."""
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    with small_tmpfs(tmp_path / "fs", 512) as fs:
        out = fs / "artifacts"
        out.mkdir()
        _artifact(out)
        fill(fs)
        before = files_under(fs)
        with pytest.raises(DiskFullError, match="ENOSPC"):
            build_targets(record, ["hopper-fp8"], out, catalog, calibration)
        assert files_under(fs) == before
        assert artifact_dirs(out) == [out / "hopper-fp8"]


@pytest.fixture(scope="module")
def built(_tiny_models, tmp_path_factory, catalog, repo_root, calibration):
    """hopper-fp8 of the tiny Llama, built once for the evaluation tests below."""
    record = intake(_tiny_models["llama"], load_gates(repo_root / "gates.yaml", catalog))
    out = tmp_path_factory.mktemp("built") / "artifacts"
    build_targets(record, ["hopper-fp8"], out, catalog, calibration)
    return record, out


@pytest.mark.heavy
@pytest.mark.parametrize("full", ["results", "reference cache"])
def test_a_full_disk_during_evaluation_is_transient_and_leaves_no_half_results(
    built, tmp_path, repo_root, full
):
    """Results are written with json, the source reference with torch.save (which reports ENOSPC as
    a bare RuntimeError): either way DiskFullError (exit 75) naming the file, nothing truncated."""
    record, artifacts = built
    with small_tmpfs(tmp_path / "fs", 64) as fs:
        out = fs / "eval" if full == "results" else tmp_path / "eval"
        suites, ctx = _tiny_text_suite(
            tmp_path, repo_root, fs / "cache" if full != "results" else tmp_path / "cache"
        )
        fill(fs)
        with pytest.raises(DiskFullError) as caught:
            evaluate(Path(record.path), record.content_hash, artifacts, out, suites, ctx)
        message = str(caught.value)
        assert caught.value.exit_code == 75 and "ENOSPC" in message and "free space and re-run" in message
        assert str(fs) in message and "\n" not in message
        assert files_under(fs) == ["filler"]
        if full == "reference cache":
            assert not out.exists()  # nothing written before the source's reference


# --- a failed build leaves no empty --out


@pytest.mark.heavy
def test_a_build_refused_for_fp8_source_weights_leaves_no_output_directory(tiny_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    weights = load_file(tiny_llama / "model.safetensors")
    fp8 = {k: v.to(torch.float8_e4m3fn) if k.endswith("proj.weight") else v for k, v in weights.items()}
    save_file(fp8, tiny_llama / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "new" / "artifacts"
    run = cli("build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out))
    assert run.returncode in (1, 2), run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "new").exists()
