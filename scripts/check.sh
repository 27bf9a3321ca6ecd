#!/usr/bin/env bash
# Static checks over the whole tree: ruff lint, ruff format, and mypy on src/quantgate.
# Run by .ci/run before the tests; the versions are pinned in pyproject's test extra.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "ruff check: $(.venv/bin/ruff check --show-files . 2>/dev/null | grep -c '\.py$') Python files" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
