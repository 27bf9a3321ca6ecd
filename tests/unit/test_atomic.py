"""Atomic writes and directory installs: a failure leaves the old file or tree and no temporary copy."""

from __future__ import annotations

import json
import os
import stat

import pytest

from quantgate.atomic import (
    install_dir,
    remove_dir,
    staged_dir,
    staged_file,
    write_bytes,
    write_json,
    write_text,
)

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
    stale = tmp_path / f".victim.old-{os.getpid()}"  # a leftover from a crashed run with this pid
    (stale / "junk").mkdir(parents=True)
    remove_dir(victim)
    remove_dir(tmp_path / "never-existed")
    assert list(tmp_path.iterdir()) == []
