#!/usr/bin/env bash
# The fast lane: what a contributor runs before every commit, in under five minutes on 2 cores.
# Static checks, then the unit tests that stay in this process on tiny models (`-m "unit and not
# slow and not heavy"`) on two pytest-xdist workers; pyproject's markers say what `heavy` means
# and CONTRIBUTING.md lists what it leaves to the full suite (.ci/run). Pytest options go after
# it (`./scripts/fast.sh -x -k gate`; `-n auto` for every core).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
./scripts/check.sh
status=0
.venv/bin/python -m pytest -m "unit and not slow and not heavy" -n 2 -q --durations=10 "$@" || status=$?
# the time is printed pass or fail: .ci/run's log keeps it either way
echo "fast lane: $(( $(date +%s) - started )) s"
exit "$status"
