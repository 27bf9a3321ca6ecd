#!/usr/bin/env bash
# An offline wheelhouse for a quantgate worker: lock, build, install with no index (issue 47).
#
#   scripts/wheelhouse.sh lock    LOCK [EXTRAS]   resolve quantgate[EXTRAS] (default gpu) for the target
#                                                 platform and Python into LOCK: name==version --hash
#   scripts/wheelhouse.sh build   LOCK DIR        every wheel LOCK names (hashes checked) + quantgate's own
#   scripts/wheelhouse.sh install DIR VENV [EXTRAS]  a fresh VENV from DIR, no index reached; VENV "-":
#                                                 into python3's own environment (an image's, over BASE)
#
# Target: PLATFORM (default manylinux_2_28_x86_64; older manylinux tags are accepted as the installer
# would) and PYTHON (default 3.11). Packages PyPI has only as source (sqlitedict, word2number: pure
# Python) are built to py3-none-any wheels here, found by the resolver's own "no matching
# distribution" error, and kept in DIR/../sdist-wheels beside LOCK. The torch in LOCK is whatever the
# indexes pip is configured with offer for the target: on a GPU lock, point pip at the CUDA build's
# index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128) when PyPI's lacks the driver's.
# GPU machines are set up from this, not from a hand list of wheels (bench/gpu/device_wheels.py,
# which missed mlflow, is gone).
#
# BASE=FILE (a `pip freeze` of the image's own Python, e.g. requirements/worker-gpu-base.txt): the
# image already holds these (its CUDA torch, numpy, transformers ...). The lock is resolved with them
# pinned as installed and lists only what the image lacks; the resolver sees each as a wheel without
# requirements (a local stand-in: a CUDA build such as torch 2.11.0+cu130 is on no index the build
# machine reaches); `install DIR -` then installs into the image's own Python. An image package older
# than quantgate needs (the resolver says which) is not kept: the lock pins a newer one for the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # a worker has no .venv
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
# pip checks Requires-Python against the running interpreter while resolving for another one (scipy
# 1.18 needs 3.12): the wheels' own tags already restrict them to the target
[ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PYTHON" ] || TARGET+=(--ignore-requires-python)

# The image's torch stack (torch, triton, CUDA libraries) as requirement-free wheels in $1 (a CUDA
# build such as torch 2.11.0+cu130 is on no index the build machine reaches), and $1/constraints.txt:
# every other package at the image's version where the image has it, else at PINS's (a lock that
# resolves, e.g. requirements/worker-cpu.lock), so the resolver has one candidate each and stops fast
base_standins() {
  "$PY" - "$BASE" "${PINS:-requirements/worker-cpu.lock}" "$1" <<'EOF'
import re, sys, zipfile
from pathlib import Path
base, pins_file, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
pin = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")
key = lambda name: re.sub(r"[-_.]+", "-", name).lower()
stack = re.compile(r"^(torch|triton|nvidia-(?!modelopt|ml-py).*)$")
image = {key(m[1]): (m[1], m[2]) for m in map(pin.fullmatch, map(str.strip, base.read_text().splitlines())) if m}
locked = {key(m[1]): m[2] for m in (pin.match(l) for l in pins_file.read_text().splitlines() if not l.startswith("#")) if m}
for k, (name, version) in image.items():
    if not stack.match(k):
        continue
    dist = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    with zipfile.ZipFile(out / f"{dist}-py3-none-any.whl", "w") as whl:
        info = f"{dist}.dist-info"
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: quantgate-wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
lines = [f"{image[k][0]}=={image[k][1]}" for k in image if stack.match(k)]
lines += [f"{k}=={image[k][1] if k in image else v}" for k, v in locked.items() if not stack.match(k)]
(out / "constraints.txt").write_text("\n".join(lines) + "\n")
(out / "fallback.txt").write_text("\n".join(f"{k}=={v}" for k, v in locked.items()) + "\n")
print(f"wheelhouse: the image's torch stack stands in; {sum(k in image for k in locked)} of {len(locked)} pins at the image's version", file=sys.stderr)
EOF
}

cmd=${1:?usage: scripts/wheelhouse.sh lock|build|install ...}
shift
case $cmd in
lock)
  lock=${1:?LOCK}; extras=${2:-gpu}
  sdists="$(dirname "$lock")/sdist-wheels"; mkdir -p "$sdists"
  report=$(mktemp); trap 'rm -rf "$report" "$report.t" "$report.base"' EXIT
  base_args=()
  if [ -n "${BASE:-}" ]; then
    mkdir -p "$report.base"; base_standins "$report.base"
    base_args=(--find-links "$report.base" -c "$report.base/constraints.txt")
  fi
  for _ in $(seq 40); do
    if out=$("$PY" -m pip install --dry-run --ignore-installed --target "$report.t" --report "$report" \
      "${TARGET[@]}" --find-links "$sdists" "${base_args[@]}" ".[${extras}]" 2>&1); then
      break
    fi
    # an image package older than quantgate needs: it is not kept as installed, the venv gets a newer one
    held=$(grep -oP 'The user requested \(constraint\) \K[A-Za-z0-9_.-]+(?===)' <<<"$out" | head -1 || true)
    if [ -n "$held" ] && [ -n "${BASE:-}" ]; then
      echo "wheelhouse: the image's $held does not fit: the venv gets PINS's" >&2
      pattern="^${held//[-_.]/[-_.]}=="
      current=$(grep -i "$pattern" "$report.base/constraints.txt" || true)
      fallback=$(grep -i "$pattern" "$report.base/fallback.txt" || true)
      sed -i "/${pattern}/Id" "$report.base/constraints.txt"
      if [ -n "$fallback" ] && [ "${current,,}" != "${fallback,,}" ]; then echo "$fallback" >> "$report.base/constraints.txt"; fi
      continue
    fi
    name=$(grep -o 'No matching distribution found for [A-Za-z0-9_.-]*' <<<"$out" | awk '{print $NF}' | head -1)
    if [ -z "$name" ]; then echo "$out" | grep -v 'is ignored' >&2; exit 1; fi
    echo "wheelhouse: $name has no wheel for the target: building its (pure-Python) sdist here" >&2
    "$PY" -m pip wheel --quiet --no-deps -w "$sdists" "$name" 2>&1 | { grep -v 'is ignored' >&2 || true; }
    ls "$sdists" | grep -qi "^${name//-/_}-.*py3-none-any.whl$" || { echo "wheelhouse: $name gave no py3 wheel" >&2; exit 1; }
  done
  "$PY" - "$report" "$lock" "$extras" "$PLATFORM" "$PYTHON" "${BASE:-}" <<'EOF'
import json, sys
import re
report, lock, extras, platform, python, base = sys.argv[1:]
lines = [f"# quantgate[{extras}] for {platform}, CPython {python}: scripts/wheelhouse.sh lock (do not edit)"]
if base:
    lines.append(f"# over the image's own packages ({base}): only what it lacks is pinned here")
provided = 0
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = set()
if base:
    for line in open(base):
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith("#"):
            image.add((norm(name), version))
for item in sorted(json.load(open(report))["install"], key=lambda i: i["metadata"]["name"].lower()):
    meta, info = item["metadata"], item["download_info"]
    if meta["name"] == "quantgate":
        continue  # the project itself: built into the wheelhouse from this tree
    if (norm(meta["name"]), meta["version"]) in image:
        provided += 1
        continue  # the image has it, at this version
    hashes = info.get("archive_info", {}).get("hashes", {})
    lines.append(f"{meta['name']}=={meta['version']} --hash=sha256:{hashes['sha256']}")
open(lock, "w").write("\n".join(lines) + "\n")
pinned = sum(not line.startswith("#") for line in lines)
print(f"wheelhouse: {pinned} pinned in {lock}" + (f", {provided} left to the image" if base else ""), file=sys.stderr)
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
  dir=${1:?DIR}; venv=${2:?VENV, or - for the running python3 (an image that already holds torch)}; extras=${3:-gpu}
  start=$SECONDS
  if [ "$venv" = - ]; then
    # into the image's own environment (a lock made with BASE): what it holds at a fitting version stays
    py=${PYBIN:-python3}
  else
    python${PYTHON} -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
    py=$venv/bin/python
  fi
  # no index at all, and no configured find-links or constraints: only DIR is read
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= "$py" -m pip install --quiet \
    --no-index --find-links "$dir" "quantgate[${extras}]"
  echo "wheelhouse: installed quantgate[${extras}] into $("$py" -c 'import sys; print(sys.prefix)') from $dir in $((SECONDS - start)) s" >&2
  ;;
*) echo "usage: scripts/wheelhouse.sh lock|build|install ..." >&2; exit 2 ;;
esac
