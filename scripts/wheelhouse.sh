#!/usr/bin/env bash
# An offline wheelhouse for a quantgate worker: lock, build, install with no index (issue 47).
#
#   scripts/wheelhouse.sh lock    LOCK [EXTRAS]   resolve quantgate[EXTRAS] (default gpu) for the target
#                                                 platform and Python into LOCK: name==version --hash
#   scripts/wheelhouse.sh build   LOCK DIR        every wheel LOCK names (hashes checked) + quantgate's own
#   scripts/wheelhouse.sh install DIR VENV [EXTRAS]  a fresh VENV from DIR, no index reached
#
# Target: PLATFORM (default manylinux_2_28_x86_64; older manylinux tags are accepted as the installer
# would) and PYTHON (default 3.11). Packages PyPI has only as source (sqlitedict, word2number: pure
# Python) are built to py3-none-any wheels here, found by the resolver's own "no matching
# distribution" error, and kept in DIR/../sdist-wheels beside LOCK. The torch in LOCK is whatever the
# indexes pip is configured with offer for the target: on a GPU lock, point pip at the CUDA build's
# index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128) when PyPI's lacks the driver's.
# GPU machines are set up from this, not from a hand list of wheels (bench/gpu/device_wheels.py,
# which missed mlflow, is gone).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
PYTHON=${PYTHON:-3.11}

# the installer accepts every older manylinux tag of the platform's architecture; --platform does not
# infer them, so they are named
platforms() {
  local arch=${PLATFORM##*_x86_64}
  arch=$([ -z "$arch" ] && echo x86_64 || echo aarch64)
  printf -- '--platform\n%s\n' "$PLATFORM"
  for tag in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1 linux; do
    printf -- '--platform\n%s\n' "${tag}_${arch}"
  done
  printf -- '--platform\nany\n'
}
mapfile -t TARGET < <(platforms)
TARGET+=(--python-version "$PYTHON" --implementation cp --only-binary=:all:)

cmd=${1:?usage: scripts/wheelhouse.sh lock|build|install ...}
shift
case $cmd in
lock)
  lock=${1:?LOCK}; extras=${2:-gpu}
  sdists="$(dirname "$lock")/sdist-wheels"; mkdir -p "$sdists"
  report=$(mktemp); trap 'rm -rf "$report" "$report.t"' EXIT
  for _ in 1 2 3 4 5 6 7 8; do
    if out=$("$PY" -m pip install --dry-run --ignore-installed --quiet --target "$report.t" --report "$report" \
      "${TARGET[@]}" --find-links "$sdists" ".[${extras}]" 2>&1); then
      break
    fi
    name=$(grep -o 'No matching distribution found for [A-Za-z0-9_.-]*' <<<"$out" | awk '{print $NF}' | head -1)
    if [ -z "$name" ]; then echo "$out" | grep -v 'is ignored' >&2; exit 1; fi
    echo "wheelhouse: $name has no wheel for the target: building its (pure-Python) sdist here" >&2
    "$PY" -m pip wheel --quiet --no-deps -w "$sdists" "$name" 2>&1 | { grep -v 'is ignored' >&2 || true; }
    ls "$sdists" | grep -qi "^${name//-/_}-.*py3-none-any.whl$" || { echo "wheelhouse: $name gave no py3 wheel" >&2; exit 1; }
  done
  "$PY" - "$report" "$lock" "$extras" "$PLATFORM" "$PYTHON" <<'EOF'
import json, sys
report, lock, extras, platform, python = sys.argv[1:]
lines = [f"# quantgate[{extras}] for {platform}, CPython {python}: scripts/wheelhouse.sh lock (do not edit)"]
for item in sorted(json.load(open(report))["install"], key=lambda i: i["metadata"]["name"].lower()):
    meta, info = item["metadata"], item["download_info"]
    if meta["name"] == "quantgate":
        continue  # the project itself: built into the wheelhouse from this tree
    hashes = info.get("archive_info", {}).get("hashes", {})
    lines.append(f"{meta['name']}=={meta['version']} --hash=sha256:{hashes['sha256']}")
open(lock, "w").write("\n".join(lines) + "\n")
print(f"wheelhouse: {len(lines) - 1} pinned in {lock}", file=sys.stderr)
EOF
  ;;
build)
  lock=${1:?LOCK}; dir=${2:?DIR}; mkdir -p "$dir"
  start=$SECONDS
  "$PY" -m pip download --quiet --no-deps --require-hashes "${TARGET[@]}" \
    --find-links "$(dirname "$lock")/sdist-wheels" -d "$dir" -r "$lock" 2>&1 | { grep -v 'is ignored' >&2 || true; }
  "$PY" -m pip wheel --quiet --no-deps -w "$dir" . 2>&1 | { grep -v 'is ignored' >&2 || true; }
  missing=$(comm -23 <(grep -v '^#' "$lock" | cut -d= -f1 | tr 'A-Z_.' 'a-z--' | sort -u) \
    <(ls "$dir" | sed 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--' | sort -u))
  if [ -n "$missing" ]; then echo "wheelhouse: not downloaded: $missing" >&2; exit 1; fi
  echo "wheelhouse: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1), $((SECONDS - start)) s: $dir" >&2
  ;;
install)
  dir=${1:?DIR}; venv=${2:?VENV}; extras=${3:-gpu}
  start=$SECONDS
  python${PYTHON} -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
  # no index at all, and no configured find-links or constraints: only DIR is read
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= "$venv/bin/python" -m pip install --quiet \
    --no-index --find-links "$dir" "quantgate[${extras}]"
  echo "wheelhouse: installed quantgate[${extras}] into $venv from $dir in $((SECONDS - start)) s" >&2
  ;;
*) echo "usage: scripts/wheelhouse.sh lock|build|install ..." >&2; exit 2 ;;
esac
