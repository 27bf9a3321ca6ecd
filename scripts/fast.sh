#!/usr/bin/env bash
# The fast lane: what a contributor runs before every commit. Static checks, then the unit tests
# (tiny random models; `-m "unit and not slow"`), on every core. The full suite (the default model,
# real servers) stays in .ci/run. Not yet under five minutes (CONTRIBUTING.md says why).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
./scripts/check.sh
.venv/bin/python -m pytest -m "unit and not slow" -q --durations=10 "$@"
echo "fast lane: $(( $(date +%s) - started )) s"
