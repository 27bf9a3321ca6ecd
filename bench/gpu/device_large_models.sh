#!/usr/bin/env bash
# Issue 29 on the single lent H200 (and issue 27's MoE evaluation after its fix), in consecutive
# calls of the device tool; the machine keeps /tmp while it stays warm (30 s). BENCHMARKS.md,
# "Models larger than one GPU (issue 29)", has what came back. Phases:
#   offload-build  carry .whl, .qg29: wheels into /tmp/site, a 70B-dense shape (LAYERS of its 80,
#                  default 12) made on the GPU, quantgate build --targets hopper-fp8 (bench/gpu/gpu_offload.py)
#   offload-eval   quantgate eval --profile full, resident and under --max-memory (MAX_MEMORY, default
#                  16GB), records compared; then the 70B shape is removed (the disk)
#   moe            a 30B-A3B shape (LAYERS, default 16, of its 48), quantgate build hopper-fp8 and
#                  quantgate eval --profile full wikitext on the GPU (bench/gpu/gpu_scale.py --gen-items 0)
#   profile        carry .whl, .qg29: the gpu-marked tests of test_formats and test_native_fp8, then a
#                  SIZE (default 8b) shape made and built to hopper-fp8, bench/gpu/fused_fp8_quant.py (the fused
#                  quantization against the eager one), and the scoring passes under torch.profiler (bench/gpu/gpu_profile_scoring.py,
#                  WINDOWS default 32; EAGER_TOO=1 scores again with the eager quantization)
#   ddp            carry .whl, .qg29: llm-compressor's own data-parallel oneshot (bench/gpu/oneshot_ddp.py), a SIZE
#                  (default 1b) shape of LAYERS (default 4) layers built by 1 process and by 2 ranks sharing the
#                  GPU (gloo), for each recipe in RECIPES (default nvfp4 w4a16-gptq-g64); the artifacts compared
#                  tensor by tensor; NCCL_TOO=1: then 2 ranks under NCCL on the one GPU
#   nvfp4-build    carry .whl, .qg29: a SIZE (default 8b) shape, quantgate build --targets blackwell-nvfp4 --device
#                  cuda against the bare oneshot of its recipe (with FP8 KV) on the GPU (bench/gpu/oneshot_ddp.py versus);
#                  MAX_MEMORY=SIZE: the build again under --max-memory SIZE (layer by layer), bytes compared;
#                  PROFILE=1: the build once more under cProfile, its top calls by cumulative time
set -uo pipefail
phase=$1
out=${OUT:-/tmp/out}
mkdir -p /tmp/site /tmp/qg "$out"
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench/gpu PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -d .qg29 ] && cp -r .qg29/tok .qg29/datasets /tmp/qg/
if [ ! -d /tmp/site/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
fi
case $phase in
offload-build)
  nvidia-smi -L; df -h /tmp | tail -1; free -g | head -2
  python3 bench/gpu/gpu_offload.py make-build --tokenizer /tmp/qg/tok --work /tmp/o --out "$out" --layers "${LAYERS:-12}"
  tail -5 "$out/build.log"; cat "$out/offload.json"
  ;;
offload-eval)
  python3 bench/gpu/gpu_offload.py eval --data /tmp/qg/datasets --work /tmp/o --out "$out" \
    --max-memory "${MAX_MEMORY:-16GB}" --suites "${SUITES:-wikitext}"
  tail -4 "$out"/eval-*.log
  rm -rf /tmp/o
  ;;
moe)
  df -h /tmp | tail -1
  rm -rf /tmp/scale_out
  python3 bench/gpu/gpu_scale.py --tokenizer /tmp/qg/tok --data /tmp/qg/datasets --out /tmp/scale_out --sizes 30b-a3b \
    --layers "${LAYERS:-16}" --gen-items 0 --step-timeout "${STEP_S:-200}" --no-anchor-build 2>&1 | tail -40
  cp /tmp/scale_out/scale.json "$out/scale_30b-a3b.json"
  tar -C /tmp/scale_out -czf "$out/scale_logs_30b-a3b.tgz" .
  ;;
profile)
  PYTHONPATH=$PYTHONPATH:$PWD/tests python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/unit/numerics/test_formats.py \
    tests/unit/numerics/test_native_fp8.py 2>&1 | tail -3
  python3 -c "from pathlib import Path; import gpu_scale as g, json; \
print(json.dumps(g.make_source('${SIZE:-8b}', Path('/tmp/qg/tok'), Path('/tmp/p/source'), 'cuda')))"
  python3 -m quantgate.cli build --checkpoint /tmp/p/source --targets hopper-fp8 --device cuda --out /tmp/p/built \
    --cache-dir /tmp/p/cache 2>&1 | tail -4
  python3 bench/gpu/fused_fp8_quant.py 2>&1 | tee "$out/fused_fp8_quant.txt"
  python3 bench/gpu/gpu_profile_scoring.py /tmp/p/source /tmp/p/built/hopper-fp8 /tmp/qg/datasets/wikitext-2-raw/wiki.test.raw \
    --windows "${WINDOWS:-32}" ${EAGER_TOO:+--eager-too} > "$out/profile_scoring.txt" 2>&1
  grep -v '^USDT' "$out/profile_scoring.txt" | cut -c1-170 | head -90
  ;;
ddp)
  nvidia-smi -L
  rm -rf /tmp/d && mkdir -p /tmp/d
  python3 bench/gpu/oneshot_ddp.py make --size "${SIZE:-1b}" --layers "${LAYERS:-4}" --tokenizer /tmp/qg/tok \
    --dest /tmp/d/src --device cuda 2>&1 | tail -1
  for recipe in ${RECIPES:-nvfp4 w4a16-gptq-g64}; do
    python3 bench/gpu/oneshot_ddp.py build --source /tmp/d/src --recipe "recipes/$recipe.yaml" --out "/tmp/d/$recipe-1" \
      --device cuda 2>&1 | grep '^{' | tee -a "$out/ddp_runs.jsonl"
    python3 -m torch.distributed.run --nproc-per-node 2 bench/gpu/oneshot_ddp.py build --source /tmp/d/src \
      --recipe "recipes/$recipe.yaml" --out "/tmp/d/$recipe-2" --device cuda --backend gloo > "$out/ddp_$recipe.log" 2>&1
    grep '^{' "$out/ddp_$recipe.log" | tee -a "$out/ddp_runs.jsonl"; grep -m3 'Error' "$out/ddp_$recipe.log"
    python3 bench/gpu/oneshot_ddp.py compare "/tmp/d/$recipe-1" "/tmp/d/$recipe-2" --json "$out/ddp_compare_$recipe.json" | head -30
  done
  [ -n "${NCCL_TOO:-}" ] || exit 0
  timeout 120 python3 -m torch.distributed.run --nproc-per-node 2 bench/gpu/oneshot_ddp.py build --source /tmp/d/src \
    --out /tmp/d/nccl-2 --device cuda --backend nccl > "$out/ddp_nccl.log" 2>&1; echo "nccl, 2 ranks on one GPU: rc=$?"
  grep -m3 -i 'error' "$out/ddp_nccl.log" | cut -c1-300
  ;;
nvfp4-build)
  nvidia-smi -L; rm -rf /tmp/v && mkdir -p /tmp/v
  python3 bench/gpu/oneshot_ddp.py make --size "${SIZE:-8b}" --tokenizer /tmp/qg/tok --dest /tmp/v/src --device cuda 2>&1 | tail -1
  python3 bench/gpu/oneshot_ddp.py versus --source /tmp/v/src --work /tmp/v/w --json "$out/nvfp4_build_${SIZE:-8b}.json" \
    ${MAX_MEMORY:+--max-memory "$MAX_MEMORY"}
  tail -n 4 /tmp/v/w/quantgate_build*.log; cp /tmp/v/w/quantgate_build*.log "$out/"
  [ -n "${PROFILE:-}" ] || exit 0  # the build again under cProfile (a new out and cache: intake and all)
  python3 -m cProfile -o "$out/build.prof" -m quantgate.cli build --checkpoint /tmp/v/src --targets blackwell-nvfp4 \
    --device cuda --out /tmp/v/p --cache-dir /tmp/v/pc > /dev/null 2>&1
  python3 -c "import pstats; pstats.Stats('$out/build.prof').sort_stats('cumulative').print_stats(45)" | cut -c1-160 | tail -60
  ;;
esac
