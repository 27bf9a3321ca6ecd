"""Atomic writes and directory installs: a failure leaves the old file or tree and no temporary copy."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantgate.runtime.atomic import (
    install_dir,
    remove_dir,
    remove_stale,
    staged_dir,
    staged_file,
    write_bytes,
    write_json,
    write_text,
)
from quantgate.runtime.errors import DiskFullError
from support.tmpfs import files_under, fill, small_tmpfs

pytestmark = pytest.mark.unit


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_replace_the_file_world_readable_and_leave_nothing_else(tmp_path):
    path = tmp_path / "sub" / "result.json"
    write_json(path, {"b": 1, "a": [1, 2]}, sort_keys=True)
    assert path.read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=1) + "\n"
    write_text(path, "second\n")
    assert path.read_text() == "second\n" and _mode(path) == 0o644
    write_bytes(path, b"\x00\x01", mode=0o600)
    assert path.read_bytes() == b"\x00\x01" and _mode(path) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]


def test_a_failure_mid_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "ref.pt"
    write_bytes(path, b"old")
    with pytest.raises(RuntimeError, match="killed"), staged_file(path) as tmp:
        tmp.write_bytes(b"half of the n")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ref.pt"]


def test_a_payload_that_cannot_be_written_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"ok": 1})
    with pytest.raises(TypeError):
        write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_rename_removes_the_temporary_file(tmp_path):
    path = tmp_path / "taken"
    (path / "child").mkdir(parents=True)  # a directory cannot be replaced by a file
    with pytest.raises(OSError):
        write_bytes(path, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_staged_file_keeps_the_private_mode_unless_told(tmp_path):
    with staged_file(tmp_path / "private") as tmp:
        tmp.write_bytes(b"x")
    assert _mode(tmp_path / "private") == 0o600


def _tree(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_install_dir_replaces_an_old_tree_only_when_the_new_one_is_complete(tmp_path):
    final = tmp_path / "hopper-fp8"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"old weights")
    (final / "stale.json").write_bytes(b"only in the old tree")
    with staged_dir(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new weights")
        assert _tree(final) == {"model.safetensors": b"old weights", "stale.json": b"only in the old tree"}
        (tmp / "sub").mkdir()
        (tmp / "sub" / "manifest.json").write_bytes(b"{}")
        assert install_dir(tmp, final) is True
    assert _tree(final) == {"model.safetensors": b"new weights", "sub/manifest.json": b"{}"}
    assert [p.name for p in tmp_path.iterdir()] == ["hopper-fp8"]


def test_a_failed_build_leaves_the_old_tree_and_no_temporary_directory(tmp_path):
    final = tmp_path / "artifact"
    final.mkdir()
    (final / "a").write_bytes(b"old")
    with pytest.raises(RuntimeError), staged_dir(final) as tmp:
        (tmp / "a").write_bytes(b"partial")
        raise RuntimeError("engine failed")
    assert _tree(final) == {"a": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_a_failed_rename_puts_the_old_tree_back(tmp_path):
    final = tmp_path / "artifact"
    final.mkdir()
    (final / "a").write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        install_dir(tmp_path / "never-built", final)
    assert _tree(final) == {"a": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_without_replace_a_tree_installed_first_is_kept(tmp_path):
    final = tmp_path / "entry"
    with staged_dir(final) as first:
        (first / "f").write_bytes(b"first")
        assert install_dir(first, final, replace=False) is True
    with staged_dir(final) as second:
        (second / "f").write_bytes(b"second")
        assert install_dir(second, final, replace=False) is False
        assert _tree(second) == {"f": b"second"}  # left to the caller
    assert _tree(final) == {"f": b"first"}
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_without_replace_a_file_in_the_way_is_an_error(tmp_path):
    (tmp_path / "entry").write_bytes(b"not a directory")
    with pytest.raises(OSError), staged_dir(tmp_path / "entry") as tmp:
        install_dir(tmp, tmp_path / "entry", replace=False)
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_remove_dir_takes_the_name_away_and_the_bytes_after(tmp_path):
    victim = tmp_path / "victim"
    (victim / "deep").mkdir(parents=True)
    (victim / "deep" / "f").write_bytes(b"x")
    stale = tmp_path / f".victim.trash-{os.getpid()}"  # a leftover from a crashed run with this pid
    (stale / "junk").mkdir(parents=True)
    remove_dir(victim)
    remove_dir(tmp_path / "never-existed")
    assert list(tmp_path.iterdir()) == []


# --- a full disk: DiskFullError (exit 75) naming the path, and nothing half-written kept


def test_a_full_disk_is_a_transient_error_naming_the_file_and_keeps_the_old_one(tmp_path):
    with small_tmpfs(tmp_path / "fs", 64) as fs:
        write_text(fs / "summary.json", "old\n")
        fill(fs)
        with pytest.raises(DiskFullError) as caught:
            write_bytes(fs / "summary.json", b"x" * 100_000)
        assert caught.value.exit_code == 75
        message = str(caught.value)
        assert str(fs / "summary.json") in message and "ENOSPC" in message
        assert "free space and re-run" in message and "\n" not in message
        assert (fs / "summary.json").read_text() == "old\n"
        assert files_under(fs) == ["filler", "summary.json"]


def test_torch_save_on_a_full_disk_is_recognised_although_torch_gives_no_errno(tmp_path):
    """torch's zip writer reports ENOSPC as a RuntimeError ('unexpected pos'), no errno attached."""
    import torch

    with small_tmpfs(tmp_path / "fs", 64) as fs:
        with pytest.raises(DiskFullError, match="ENOSPC"), staged_file(fs / "reference.pt") as tmp:
            torch.save({"logits": torch.zeros(100_000)}, tmp)
        assert files_under(fs) == []


def test_a_tree_that_fills_the_disk_leaves_no_directory_behind(tmp_path):
    import torch
    from safetensors.torch import save_file

    with small_tmpfs(tmp_path / "fs", 64) as fs:
        with (
            pytest.raises(DiskFullError) as caught,
            staged_dir(fs / "hopper-fp8", "building hopper-fp8") as tmp,
        ):
            (tmp / "config.json").write_text("{}")
            save_file({"w": torch.zeros(100_000)}, str(tmp / "model.safetensors"))
        assert "building hopper-fp8" in str(caught.value) and str(fs / "hopper-fp8") in str(caught.value)
        assert list(fs.iterdir()) == []


def test_other_failures_on_a_disk_with_room_stay_what_they_were(tmp_path):
    with pytest.raises(RuntimeError, match="engine bug"), staged_dir(tmp_path / "a") as tmp:
        (tmp / "f").write_bytes(b"x")
        raise RuntimeError("engine bug")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError) as caught:
        write_bytes(tmp_path / "file" / "result.json", b"x")  # a file where a directory should be
    assert not isinstance(caught.value, DiskFullError)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


# --- killed processes' temporary directories


_HOLD = """
import sys, time
from pathlib import Path
from quantgate.runtime.atomic import staged_dir
with staged_dir(Path(sys.argv[1])) as tmp:
    (tmp / "half.safetensors").write_bytes(b"half")
    print(tmp, flush=True)
    time.sleep(600)
"""


def _holder(final):
    """A process inside ``staged_dir(final)``; returns (process, its temporary directory)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(final)], stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_writers_directory_is_removed_and_a_live_writers_kept(tmp_path):
    final = tmp_path / "hopper-fp8"
    killed, killed_tmp = _holder(final)
    live, live_tmp = _holder(final)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert killed_tmp.is_dir()  # SIGKILL runs no cleanup: this is the leftover
        assert remove_stale(tmp_path, "hopper-fp8") == [killed_tmp]
        assert not killed_tmp.exists()
        assert live_tmp.is_dir() and (live_tmp / "half.safetensors").exists()
        with staged_dir(final) as ours:  # staged_dir cleans too, and leaves the live one alone
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live_tmp.name, ours.name])
    finally:
        live.kill()
        live.wait()
    assert remove_stale(tmp_path, "hopper-fp8") == [live_tmp]
    assert list(tmp_path.iterdir()) == []


def test_a_live_pid_keeps_an_unlocked_directory_and_other_names_are_never_touched(tmp_path):
    mine = tmp_path / f".hopper-fp8.tmp-{os.getpid()}-abcd"  # being created: not locked yet
    mine.mkdir()
    others = [tmp_path / n for n in (".hopper-fp8-b.tmp-1-ab", ".rocm.tmp-1-ab", "hopper-fp8", ".cache")]
    for d in others:
        d.mkdir()
    assert remove_stale(tmp_path, "hopper-fp8") == []
    assert sorted(tmp_path.iterdir()) == sorted([mine, *others])


def test_leftovers_from_before_names_had_pids_go_once_an_hour_old(tmp_path):
    old, young = tmp_path / ".hopper-fp8.tmp-k2j4_x9q", tmp_path / ".hopper-fp8.a8dk3j2m.tmp"
    for d in (old, young):
        (d / "sub").mkdir(parents=True)
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    assert remove_stale(tmp_path, "hopper-fp8") == [old]
    assert young.is_dir()


def test_a_set_aside_tree_is_kept_while_it_may_be_the_only_copy(tmp_path):
    aside = tmp_path / ".artifact.old-999999999"  # install_dir's, of a process gone (pid max is lower)
    (aside / "a").mkdir(parents=True)
    assert remove_stale(tmp_path, "artifact") == []
    (tmp_path / "artifact").mkdir()
    assert remove_stale(tmp_path, "artifact") == [aside]


def test_replacing_a_tree_leaves_no_aside_copy_at_any_moment(tmp_path):
    """RENAME_EXCHANGE: final always names a whole tree; the old one ends under the locked temporary name."""
    final = tmp_path / "artifact"
    with staged_dir(final) as first:
        (first / "v").write_bytes(b"1")
        install_dir(first, final)
    inode = final.stat().st_ino
    with staged_dir(final) as second:
        (second / "v").write_bytes(b"2")
        install_dir(second, final)
        assert final.stat().st_ino != inode and (final / "v").read_bytes() == b"2"
        assert [p.name for p in tmp_path.iterdir()] == ["artifact"]
