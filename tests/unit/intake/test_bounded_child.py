"""``bounded_child``: work run in a forked child stops at the kernel's limits, whatever it does.

Each limit is hit by work that a check between Python lines could not stop: one C call that
never returns (a big-integer power), an allocation of gigabytes, a child that gets no CPU at all.
"""

from __future__ import annotations

import os
import signal

import pytest

from quantgate.intake import bounded_child
from quantgate.runtime.memory import peak_rss_bytes

pytestmark = pytest.mark.unit

LIMITS = bounded_child.Limits(cpu_seconds=1, memory_bytes=256 * 1024**2, wall_seconds=20.0)


def test_the_value_comes_back():
    assert bounded_child.run(lambda: {"ids": [1, 2]}, LIMITS) == bounded_child.Outcome(value={"ids": [1, 2]})


def test_one_c_call_is_stopped_at_the_cpu_limit():
    outcome = bounded_child.run(lambda: 10**100_000_000, LIMITS)
    assert outcome.failure == "cpu", outcome  # the CPU limit, not the wall-clock deadline, stopped it


def test_an_allocation_past_the_budget_fails_in_the_child_only():
    before = peak_rss_bytes()
    outcome = bounded_child.run(lambda: len(bytearray(4 * 1024**3)), LIMITS)
    assert outcome.failure == "memory", outcome
    assert peak_rss_bytes() == before  # the parent allocated nothing


def test_an_exception_is_named():
    outcome = bounded_child.run(lambda: 1 / 0, LIMITS)
    assert (outcome.failure, outcome.detail) == ("raised", "ZeroDivisionError: division by zero")


def test_a_child_without_cpu_is_killed_at_the_wall_clock_deadline():
    limits = bounded_child.Limits(cpu_seconds=60, memory_bytes=256 * 1024**2, wall_seconds=1.0)
    outcome = bounded_child.run(lambda: os.kill(os.getpid(), signal.SIGSTOP), limits)
    assert outcome.failure == "wall", outcome


def test_a_child_that_dies_is_reported_by_its_signal():
    outcome = bounded_child.run(lambda: os.kill(os.getpid(), signal.SIGSEGV), LIMITS)
    assert (outcome.failure, outcome.detail) == ("signal", "SIGSEGV")


def test_a_process_already_under_an_address_space_limit_still_runs_its_checks():
    """Intake inside a process limited from outside (``prlimit --as``, a container's limit): the
    child's budget is capped at that limit instead of failing to raise it (a valid tokenizer was once
    refused that way, the child exiting before it ran anything)."""
    import subprocess
    import sys

    code = (
        "import resource; from quantgate.intake import bounded_child as b\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * 4096\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 64 * 1024**2, used + 64 * 1024**2))\n"
        "limits = b.Limits(cpu_seconds=5, memory_bytes=3 * 1024**3, wall_seconds=20.0)\n"
        "print(b.run(lambda: sum(range(1000)), limits))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert "value=499500" in done.stdout, (done.stdout, done.stderr)
