"""The sandbox for model-written code: hostile programs are contained and never scored passed.

Each hostile program below is checked twice: from the result (not passed, nothing leaked into
its output) and from the host (the file, socket, directory or process it went for is as it
was). They run in whichever way this machine builds the sandbox: as root (CI) the root path,
as anyone else user namespaces (``test_sandbox_modes.py`` takes that path from root, and covers
machines where no sandbox can be built); where neither works they are skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from quantgate.evaluate import sandbox
from quantgate.evaluate.sandbox import SANDBOX_UID, run_untrusted

MODE = sandbox.mode()
SURVIVOR_GRACE_S = 12.0  # the sandbox's longest default timeout (10 s) and its teardown
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(MODE not in ("root", "userns"), reason=f"no sandbox can be built here: {MODE}"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
]

REPO = Path(__file__).resolve().parents[3]
NOT_PASSED = {"failed", "timeout", "resource_limit"}


def _sandbox_uid_pids() -> set[int]:
    """Processes that can only be the sandbox's: of ``SANDBOX_UID`` (root mode), or of our own
    uid in another user namespace (userns mode)."""
    ours = os.readlink("/proc/self/ns/user")
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            userns = os.readlink(f"/proc/{entry}/ns/user") if MODE == "userns" else ours
        except OSError:
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        uid = int(uid_line.split()[1])
        if (MODE == "root" and uid == SANDBOX_UID) or (uid == os.getuid() and userns != ours):
            pids.add(int(entry))
    return pids


@pytest.fixture(autouse=True)
def no_survivors():
    """After every run, no process of the sandbox is left that was not there before.

    The sandbox's processes of another test worker (a HumanEval run beside this one) have the same
    uid; they end within their own timeout, so what counts is a process still alive after the
    longest one (10 s) has passed, not one seen at the instant this test ends."""
    before = _sandbox_uid_pids()
    yield
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    while (new := _sandbox_uid_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: _describe(pid) for pid in new}
    assert not left, f"processes of the sandbox survived: {left}"


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return f"{cmdline!r} state {state} pidns {os.readlink(f'/proc/{pid}/ns/pid')}"
    except OSError:
        return "gone"


@pytest.fixture
def visible_dir():
    """A host directory outside every temp dir, world-readable, that the sandbox must not show:
    under /var/lib as root, else under the home directory (the caller's own files)."""
    parent = "/var/lib" if os.geteuid() == 0 else str(Path.home())
    path = Path(tempfile.mkdtemp(prefix="quantgate-sandbox-test-", dir=parent))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _secret(directory: Path) -> tuple[Path, str]:
    token = f"secret-{uuid.uuid4().hex}"
    path = directory / "secret.txt"
    path.write_text(token)
    path.chmod(0o600)
    return path, token


def _tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in directory.rglob("*") if p.is_file()}


def _assert_contained(result, *leaks: str) -> None:
    assert result.status in NOT_PASSED, result
    assert not result.passed
    for leak in leaks:
        assert leak not in result.stdout_tail + result.stderr_tail


def test_correct_program_passes_as_unprivileged_user_with_minimal_env():
    result = run_untrusted("import os\nprint('hello', os.getuid(), sorted(os.environ))\n")
    assert result.passed and result.status == "passed" and result.returncode == 0
    libpython = any(p.name.startswith("libpython") for p in (Path(sys.base_prefix) / "lib").iterdir())
    env = ["HOME", "LANG", *(["LD_LIBRARY_PATH"] if libpython else []), "PATH", "TMPDIR"]
    assert result.stdout_tail == f"hello {SANDBOX_UID} {env}\n"


def test_the_program_has_no_capabilities_and_sees_no_host_files():
    program = (
        "import os\n"
        "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print([status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb')])\n"
        f"print([p for p in ('/home', '/root', '/var/lib', '/sys', {str(REPO)!r}) if os.path.exists(p)])\n"
    )
    result = run_untrusted(program)
    assert result.passed, result
    assert result.stdout_tail == f"{['0000000000000000'] * 4}\n[]\n"


def test_failing_assert_fails():
    result = run_untrusted("def add(a, b):\n    return a - b\n\nassert add(2, 2) == 4\n")
    assert result.status == "failed" and result.returncode == 1 and not result.passed
    assert "AssertionError" in result.stderr_tail


def test_output_tails_are_bounded():
    result = run_untrusted("print('x' * 100_000 + 'END')")
    assert result.passed
    assert len(result.stdout_tail) <= sandbox.TAIL_BYTES and result.stdout_tail.endswith("END\n")


def test_loopback_does_not_reach_the_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        result = run_untrusted(program)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    _assert_contained(result)
    assert "PermissionError" in result.stderr_tail  # seccomp allows no socket


def test_public_address_is_unreachable():
    result = run_untrusted("import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=2)\n")
    _assert_contained(result)
    assert "PermissionError" in result.stderr_tail  # seccomp allows no socket


@pytest.mark.parametrize("where", ["tmp_path", "visible_dir", "/etc/shadow"])
def test_root_only_files_cannot_be_read(where, tmp_path, visible_dir):
    if where == "/etc/shadow":
        path, token = Path("/etc/shadow"), "root:"
    else:
        path, token = _secret(tmp_path if where == "tmp_path" else visible_dir)
    result = run_untrusted(f"print(open({str(path)!r}).read())")
    _assert_contained(result, token)
    assert "PermissionError" in result.stderr_tail or "FileNotFoundError" in result.stderr_tail


@pytest.mark.parametrize("target", ["tmp_file", "visible_file", "visible_new", "repo_new", "repo_pyproject"])
def test_host_paths_cannot_be_written(target, tmp_path, visible_dir):
    existing = {"tmp_file": tmp_path / "data.txt", "visible_file": visible_dir / "data.txt"}
    for path in existing.values():
        path.write_text("original")
        path.chmod(0o666 if path.parent == tmp_path else 0o644)
    path = {
        **existing,
        "visible_new": visible_dir / "new.txt",
        "repo_new": REPO / f"sandbox-escape-{uuid.uuid4().hex}.txt",
        "repo_pyproject": REPO / "pyproject.toml",
    }[target]
    before = path.read_bytes() if path.exists() else None
    try:
        result = run_untrusted(f"open({str(path)!r}, 'a').write('')\nprint('OPENED')\n")
        after = path.read_bytes() if path.exists() else None
    finally:
        if before is None and path.exists():
            path.unlink()
    _assert_contained(result, "OPENED")
    assert after == before


def test_tmp_is_private(tmp_path):
    name = f"quantgate-sandbox-{uuid.uuid4().hex}"
    host_marker = tmp_path / "marker"
    host_marker.write_text("host")
    program = (
        "import os\n"
        f"assert not os.path.exists({str(host_marker)!r})\n"
        "for d in ('/tmp', '/var/tmp', '/dev/shm', os.getcwd()):\n"
        f"    p = os.path.join(d, {name!r})\n"
        "    open(p, 'w').write('inside')\n"
        "    assert open(p).read() == 'inside'\n"
        "print('wrote')\n"
    )
    result = run_untrusted(program)
    assert result.passed, result  # writing its own tmp is allowed: the host never sees it
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not (Path(directory) / name).exists()
    assert host_marker.read_text() == "host"


def test_fork_bomb_is_contained():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_untrusted(program, timeout_s=3)
    _assert_contained(result)
    assert result.seconds < 3 + 5
    # the autouse fixture checks that no process of the sandbox uid is left


def test_new_processes_are_refused_and_threads_allowed():
    """Seccomp: each process would have its own RLIMIT_AS, so the program gets none; threads share it."""
    program = (
        "import os, subprocess, threading\n"
        "seen = []\n"
        "for name, start in (('fork', os.fork), ('subprocess', lambda: subprocess.run(['/bin/true'])),\n"
        "                    ('posix_spawn', lambda: os.posix_spawn('/bin/true', ['true'], {}))):\n"
        "    try:\n"
        "        if start() == 0:\n"
        "            os._exit(0)\n"
        "        seen.append(name + ' STARTED')\n"
        "    except PermissionError:\n"
        "        seen.append(name + ' refused')\n"
        "thread = threading.Thread(target=lambda: seen.append('thread ran'))\n"
        "thread.start()\n"
        "thread.join()\n"
        "print(seen)\n"
    )
    result = run_untrusted(program)
    assert result.passed, result
    assert (
        result.stdout_tail
        == f"{['fork refused', 'subprocess refused', 'posix_spawn refused', 'thread ran']}\n"
    )


@pytest.mark.parametrize(
    "program",
    ["b = bytearray(4 * 2**30)", "chunks = [bytearray(2**28) for _ in range(16)]"],
    ids=["one-4GB", "4GB-in-chunks"],
)
def test_memory_bomb_hits_the_limit(program):
    result = run_untrusted(program)
    _assert_contained(result)
    assert result.status == "resource_limit"
    assert "MemoryError" in result.stderr_tail


def test_endless_loop_times_out_and_leaves_nothing_running():
    program = (
        "import threading, time\n"
        "threading.Thread(target=lambda: time.sleep(600), daemon=False).start()\n"
        "while True:\n"
        "    pass\n"
    )
    result = run_untrusted(program, timeout_s=2)
    assert result.status == "timeout" and result.returncode is None and not result.passed
    assert 2 <= result.seconds < 2 + 5


def test_killing_the_parent_and_the_test_process_fails():
    me, my_parent = os.getpid(), os.getppid()
    program = (
        "import os, signal\n"
        "errors = []\n"
        f"for pid, sig in ((os.getppid(), signal.SIGKILL), ({me}, signal.SIGTERM),\n"
        f"                 ({my_parent}, signal.SIGKILL), (1, signal.SIGKILL)):\n"
        "    try:\n"
        "        os.kill(pid, sig)\n"
        "        errors.append('KILLED')\n"
        "    except OSError as exc:\n"
        "        errors.append(type(exc).__name__)\n"
        "print(errors, flush=True)\n"
        "os.kill(-1, signal.SIGKILL)\n"
    )
    result = run_untrusted(program)
    # seccomp allows no signal to any process: the supervisor, the host's, kill(-1) all refused
    _assert_contained(result, "KILLED")
    assert result.stdout_tail == f"{['PermissionError'] * 4}\n", result.stdout_tail
    assert result.stderr_tail.endswith("PermissionError: [Errno 1] Operation not permitted\n")
    os.kill(me, 0)
    os.kill(my_parent, 0)


@pytest.mark.parametrize("where", ["tmp_path", "visible_dir"])
def test_deleting_host_files_fails(where, tmp_path, visible_dir):
    root = (tmp_path if where == "tmp_path" else visible_dir) / "victim"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    before = _tree(root)
    result = run_untrusted(f"import shutil\nshutil.rmtree({str(root)!r})\nprint('DELETED')\n")
    _assert_contained(result, "DELETED")
    assert _tree(root) == before


def test_parent_backstop_kills_the_whole_namespace(monkeypatch):
    """Should the supervisor not end the run, the caller kills it and everything under it."""
    monkeypatch.setattr(sandbox, "_BACKSTOP_GRACE_S", -4.0)  # the caller gives up after 1 s
    program = "import threading\nthreading.Thread(target=lambda: None).start()\nwhile True:\n    pass\n"
    result = run_untrusted(program, timeout_s=5)
    assert result.status == "timeout" and not result.passed
    assert result.seconds < 4


def test_cpu_limit_stops_a_busy_loop():
    result = run_untrusted("while True:\n    pass\n", timeout_s=10, cpu_seconds=1)
    _assert_contained(result)
    assert result.status == "resource_limit" and result.returncode < 0
    assert result.seconds < 5


def test_a_harness_that_cannot_start_says_how_it_ended():
    # on a GPU worker (2026-12-04) every HumanEval item failed with "the tests' harness did not
    # start" and nothing more; the setup error now says how the harness's interpreter ended
    from quantgate.evaluate.sandbox import Check, run_check

    result = run_check("def f():\n    return 1\n", Check("def check(f):\n    assert f() == 1\n", "f"),
                       memory_bytes=4 * 2**20)  # fmt: skip
    assert result.status == "sandbox_error"
    assert "the tests' harness did not start (its interpreter " in result.error, result.error


def test_a_harness_that_cannot_start_passes_on_its_last_words():
    # the status alone ("exited with 127") did not say which library or module failed: the
    # harness's stderr is kept until it has started. Under a tight address space the
    # interpreter starts and then dies importing, saying so (MemoryError); the first size at
    # which it says anything depends on the interpreter's build, so a range is tried
    from quantgate.evaluate.sandbox import Check, run_check

    errors = []
    for megabytes in range(8, 40, 2):
        result = run_check("def f():\n    return 1\n", Check("def check(f):\n    assert f() == 1\n", "f"),
                           memory_bytes=megabytes * 2**20)  # fmt: skip
        if result.status != "sandbox_error":
            break
        errors.append(result.error)
    assert any(error.endswith("MemoryError)") for error in errors), errors
