"""The sandbox without root, and where none can be built.

A developer's workstation is not root: there the sandbox is built in user namespaces. These
tests become a non-root user (``sandbox_as_user.py``, started by root, as CI runs) and run
hostile programs through that path for real, checking each from the result and from the host.
Where no sandbox can be built (user namespaces disabled, or exhausted halfway through setup,
or ``QUANTGATE_SANDBOX=none``), nothing runs and the result says why.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from quantgate.evaluate import sandbox
from quantgate.evaluate.sandbox import SANDBOX_GID, SANDBOX_UID, run_untrusted
from quantgate.evaluate.suites.humaneval import check_for, problems

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SANDBOX_PY = Path(sandbox.__file__).resolve()


def _free_uid() -> int:
    """A uid no account and no process has (concurrent runs of these tests each get their own)."""
    taken = {u.pw_uid for u in pwd.getpwall()}
    for entry in os.listdir("/proc"):
        try:
            taken.add(os.stat(f"/proc/{entry}").st_uid)
        except OSError:
            pass
    return random.SystemRandom().choice(sorted(set(range(61000, 62000)) - taken))


USER = _free_uid()  # becomes the non-root caller
NOT_PASSED = {"failed", "timeout", "resource_limit"}

needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="becoming another user needs root; run as non-root, test_sandbox.py already takes the userns path",
)


def _interpreters() -> list[str]:
    """Interpreters a non-root user may execute: the system's first (the venv's may sit under /root)."""
    found = [shutil.which(name, path="/usr/bin:/bin:/usr/local/bin") for name in ("python3",)]
    return [p for p in [*found, sys.executable] if p]


def as_user(programs: dict, tmp_path: Path, **request) -> dict:
    """Run ``programs`` in the sandbox as uid ``USER`` (see ``sandbox_as_user.py``); its JSON answer."""
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"uid": USER, "sandbox": str(SANDBOX_PY), "programs": programs, **request}))
    path.chmod(0o644)
    reasons = []
    for python in _interpreters():
        done = subprocess.run(
            [python, "-I", "-S", str(HERE / "sandbox_as_user.py"), str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        if "skip" not in answer:
            assert answer["euid"] == USER
            return answer
        reasons.append(answer["skip"])
    pytest.skip("; ".join(reasons))


@pytest.fixture
def host_dirs():
    """Directories of the non-root user outside every temp dir: one private (0700), one world-
    readable in /usr/local/share, which the sandbox shows read-only."""
    private = Path(tempfile.mkdtemp(prefix="quantgate-sandbox-test-", dir="/var/lib"))
    shared_root = Path("/usr/local/share")
    shared_root.mkdir(parents=True, exist_ok=True)
    shared = Path(tempfile.mkdtemp(prefix="quantgate-sandbox-test-", dir=shared_root))
    try:
        for directory, mode in ((private, 0o700), (shared, 0o755)):
            os.chown(directory, USER, USER)
            directory.chmod(mode)
        yield private, shared
    finally:
        shutil.rmtree(private)
        shutil.rmtree(shared)


def _checked(solution: str, problem: dict) -> dict:
    """A ``run_check`` request for ``sandbox_as_user.py``: the solution and the problem's tests."""
    check = check_for(problem)
    return {"program": solution, "check": {"tests": check.tests, "entry_point": check.entry_point}}


def _owned(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    os.chown(path, USER, USER)
    path.chmod(mode)
    return path


@pytest.mark.heavy
@needs_root
def test_non_root_user_runs_programs_in_a_user_namespace_sandbox(tmp_path, host_dirs):
    """The userns path end to end: programs run, and every hostile one is contained."""
    private, shared = host_dirs
    token = f"secret-{uuid.uuid4().hex}"
    secret = _owned(private / "secret.txt", token, 0o600)
    data = _owned(shared / "data.txt", "original", 0o644)
    name = f"quantgate-sandbox-{uuid.uuid4().hex}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    programs = {
        "identity": (
            "import os\n"
            "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
            "print(os.getuid(), os.getgid(), [status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')])\n"
            "print(sorted(os.environ))\n"
        ),
        "assert": "def add(a, b):\n    return a - b\n\nassert add(2, 2) == 4\n",
        "loopback": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
        "internet": "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=2)\n",
        "secret": f"print(open({str(secret)!r}).read())\n",
        "append": f"open({str(data)!r}, 'a').write('x')\nprint('OPENED')\n",
        "create": f"open({str(shared / 'new.txt')!r}, 'w').write('x')\nprint('OPENED')\n",
        "tmp": (
            "import os\n"
            "for d in ('/tmp', '/var/tmp', '/dev/shm', os.getcwd()):\n"
            f"    open(os.path.join(d, {name!r}), 'w').write('inside')\n"
        ),
        "host_hidden": (
            "import os\n"
            f"seen = [p for p in ('/home', '/root', '/var/lib', '/sys', {str(REPO)!r}, {str(private)!r}) if os.path.exists(p)]\n"
            "assert not seen, seen\n"
        ),
        "supervisor": (
            "import os, signal, sys\n"
            "sent = []\n"
            "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGALRM,\n"
            "            signal.SIGCHLD, signal.SIGSTOP, signal.SIGKILL):\n"
            "    try:\n"
            "        os.kill(os.getppid(), sig)\n"
            "        sent.append(sig)\n"
            "    except PermissionError:\n"
            "        pass\n"
            "print(sent or 'no signal sent')\n"
            "opened = []\n"
            "for fd in os.listdir('/proc/1/fd'):  # its status pipe among them\n"
            "    try:\n"
            "        os.open(f'/proc/1/fd/{fd}', os.O_WRONLY)\n"
            "        opened.append(fd)\n"
            "    except PermissionError:\n"
            "        pass\n"
            "print(opened or 'denied')\n"
            f"for pid in ({os.getpid()}, -1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print('KILLED')\n"
            "    except OSError as exc:\n"
            "        print(type(exc).__name__)\n"
            "sys.exit(3)\n"
        ),
        "fork_bomb": {
            "program": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "kwargs": {"timeout_s": 3},
        },
        "memory": "b = bytearray(4 * 2**30)\n",
        "endless": {
            "program": "import threading\nthreading.Thread(target=lambda: None).start()\nwhile True:\n    pass\n",
            "kwargs": {"timeout_s": 2},
        },
    }
    # HumanEval solutions checked as the suite checks them: the canonical ones pass, a wrong one fails
    for problem in problems()[:3]:
        programs[problem["task_id"]] = _checked(problem["prompt"] + problem["canonical_solution"], problem)
    wrong = problems()[0]
    programs["wrong_solution"] = _checked(wrong["prompt"] + "    return None\n", wrong)
    request = {k: v if isinstance(v, dict) else {"program": v} for k, v in programs.items()}
    try:
        answer = as_user(request, tmp_path, host_reads=[str(secret), str(data)])
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert answer["mode"] == "userns", answer["mode"]
    assert answer["unreadable_on_host"] == []  # file permissions would not have hidden them
    runs = answer["runs"]
    for name_, run in runs.items():
        assert run["status"] != "sandbox_error", (name_, run["error"])
        assert run["survivors"] == [], (name_, run)

    uid, gid, caps = runs["identity"]["stdout"].splitlines()[0].split(" ", 2)
    assert runs["identity"]["status"] == "passed"
    assert (int(uid), int(gid)) == (SANDBOX_UID, SANDBOX_GID)
    assert caps == str(["0000000000000000"] * 5)  # no capability, none to regain
    assert runs["identity"]["stdout"].splitlines()[1].startswith("['HOME', 'LANG'")

    assert runs["assert"]["status"] == "failed" and "AssertionError" in runs["assert"]["stderr"]
    assert runs["loopback"]["status"] in NOT_PASSED and "PermissionError" in runs["loopback"]["stderr"]
    assert "PermissionError" in runs["internet"]["stderr"]  # seccomp allows no socket
    assert runs["secret"]["status"] in NOT_PASSED and "FileNotFoundError" in runs["secret"]["stderr"]
    assert token not in runs["secret"]["stdout"] + runs["secret"]["stderr"]
    for name_ in ("append", "create"):
        assert runs[name_]["status"] in NOT_PASSED and "OPENED" not in runs[name_]["stdout"]
        assert "Read-only file system" in runs[name_]["stderr"], runs[name_]
    assert data.read_text() == "original" and not (shared / "new.txt").exists()
    assert runs["tmp"]["status"] == "passed"
    assert not any((Path(d) / name).exists() for d in ("/tmp", "/var/tmp", "/dev/shm"))
    assert runs["host_hidden"]["status"] == "passed", runs["host_hidden"]["stderr"]

    # the program may signal no process (seccomp), its supervisor included: its own exit code 3
    # is reported, the supervisor's descriptors are out of reach, host processes too
    supervisor = runs["supervisor"]
    assert (supervisor["status"], supervisor["returncode"]) == ("failed", 3), supervisor
    assert supervisor["stdout"].split("\n")[:4] == [
        "no signal sent",
        "denied",
        "PermissionError",
        "PermissionError",
    ]

    assert runs["fork_bomb"]["status"] in NOT_PASSED and runs["fork_bomb"]["seconds"] < 3 + 5
    assert runs["memory"]["status"] == "resource_limit" and "MemoryError" in runs["memory"]["stderr"]
    assert runs["endless"]["status"] == "timeout" and 2 <= runs["endless"]["seconds"] < 2 + 5
    for task_id in ("HumanEval/0", "HumanEval/1", "HumanEval/2"):
        assert runs[task_id]["status"] == "passed", runs[task_id]
    assert (
        runs["wrong_solution"]["status"] == "failed" and "AssertionError" in runs["wrong_solution"]["stderr"]
    )


@needs_root
@pytest.mark.parametrize(
    ("limit", "why"),
    [
        (0, "user namespaces are disabled (user.max_user_namespaces = 0)"),
        (1, "No space left on device"),  # the first namespace is made, the program's nested one refused
    ],
    ids=["disabled", "exhausted-halfway"],
)
def test_no_sandbox_for_a_non_root_user_without_user_namespaces_runs_nothing(limit, why, tmp_path, host_dirs):
    private, _ = host_dirs
    marker = private / "ran"
    programs = {"marker": {"program": f"open({str(marker)!r}, 'w').write('ran')\n"}}
    answer = as_user(programs, tmp_path, max_user_namespaces=limit)
    run = answer["runs"]["marker"]
    assert run["status"] == "sandbox_error" and run["returncode"] is None
    assert why in run["error"] and run["error"].startswith("sandbox setup failed")
    assert run["survivors"] == []
    assert not marker.exists()


@pytest.mark.parametrize("broken", ["setting_none", "no_unshare"])
def test_no_sandbox_means_sandbox_error_and_nothing_runs(broken, tmp_path, monkeypatch):
    if broken == "setting_none":
        monkeypatch.setenv(sandbox.ENV, "none")
    else:
        monkeypatch.setattr(sandbox.shutil, "which", lambda *args, **kwargs: None)
    marker = tmp_path / "ran"
    result = run_untrusted(f"open({str(marker)!r}, 'w').write('ran')")
    assert result.status == "sandbox_error" and not result.passed and result.returncode is None
    assert result.error is not None and result.error.startswith("sandbox setup failed")
    assert ("QUANTGATE_SANDBOX=none" if broken == "setting_none" else "`unshare`") in result.error
    assert result.error in result.stderr_tail
    assert result.error == f"sandbox setup failed: {sandbox.unavailable()}"
    assert not marker.exists()


def test_an_unknown_setting_builds_no_sandbox(monkeypatch):
    monkeypatch.setenv(sandbox.ENV, "off")
    assert "is not a setting: use auto or none" in sandbox.mode()
    assert run_untrusted("pass").status == "sandbox_error"
