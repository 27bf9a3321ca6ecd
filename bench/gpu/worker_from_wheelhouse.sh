#!/usr/bin/env bash
# Issue 47, item 2: every command on one GPU worker, installed from the wheelhouse only, against a
# registry and store running on the worker (MLflow server + moto S3). Logs each step's exit code,
# wall time and peak RSS to $OUT/worker_steps.tsv and its output to $OUT/<step>.log.
#
# On the worker (a copy of this tree, with WHEELHOUSE built for it by scripts/wheelhouse.sh build
# from a GPU lock, e.g. requirements/worker-gpu.lock made with the CUDA torch index):
#   WHEELHOUSE=/path/wheelhouse OUT=/tmp/out bench/gpu/worker_from_wheelhouse.sh
# TARGETS, MODEL (a source checkpoint; default: the embedded default model), TENANT may be set.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELHOUSE=${WHEELHOUSE:?the wheelhouse directory}
OUT=${OUT:-/tmp/qg-worker}; mkdir -p "$OUT"
VENV=${VENV:-/tmp/qg-worker-venv}
TARGETS=${TARGETS:-hopper-fp8,blackwell-nvfp4}
WORK=$OUT/work; mkdir -p "$WORK"
printf 'step\trc\twall_s\tmax_rss_kb\n' > "$OUT/worker_steps.tsv"
step() {  # step NAME CMD...: run, log, never stop the sequence (a later step says what it lacked)
  local name=$1; shift
  /usr/bin/time -f '%e\t%M' -o "$OUT/.t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(cat "$OUT/.t" | tail -1)" >> "$OUT/worker_steps.tsv"
  echo "worker: $name rc=$rc $(tail -1 "$OUT/.t")"
}
step install scripts/wheelhouse.sh install "$WHEELHOUSE" "$VENV" gpu
QG=$VENV/bin/quantgate
step import "$VENV/bin/python" -c "import quantgate, torch, mlflow, modelopt, blake3; print(torch.cuda.get_device_name(0))"
# the registry and store on this worker: moto's S3 and an MLflow server (both from the wheelhouse)
"$VENV/bin/moto_server" -p 5055 > "$OUT/moto.log" 2>&1 & MOTO=$!
export MLFLOW_S3_ENDPOINT_URL=http://127.0.0.1:5055 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
"$VENV/bin/python" -c "import boto3; boto3.client('s3', endpoint_url='$MLFLOW_S3_ENDPOINT_URL').create_bucket(Bucket='quantgate')"
"$VENV/bin/mlflow" server --host 127.0.0.1 --port 5056 --backend-store-uri "sqlite:///$WORK/mlflow.db" \
  --artifacts-destination s3://quantgate > "$OUT/mlflow.log" 2>&1 & MLF=$!
export MLFLOW_TRACKING_URI=http://127.0.0.1:5056
sleep 15
MODEL_ARGS=(); [ -n "${MODEL:-}" ] && MODEL_ARGS=(--model "$MODEL")
step build "$QG" build "${MODEL_ARGS[@]}" --targets "$TARGETS" --out "$WORK/A"
step eval "$QG" eval --artifacts "$WORK/A" --out "$WORK/E"
step gate "$QG" gate --results "$WORK/E" --out "$WORK/R"
step publish "$QG" publish --report "$WORK/R" --artifacts "$WORK/A"
step pull "$QG" pull ${TENANT:+--tenant "$TENANT"} ${PULL_ARGS:-}
step seed timeout 20 "$QG" seed  # serves until stopped: rc 124 after 20 s is the expected end
step run "$QG" run "${MODEL_ARGS[@]}" --targets "$TARGETS"
kill "$MLF" "$MOTO" 2>/dev/null
cat "$OUT/worker_steps.tsv"
