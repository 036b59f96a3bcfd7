#!/usr/bin/env bash
# The whole job on a GPU through the project's embedded Ray: trainer (FSDP2 over NCCL), hosted
# reference and rollout (rollout=hf, decode graphs on) colocated on one GPU with fractional shares,
# weights synced by the colocated CUDA path. Runs the tiny default for 30 steps, a randomly
# initialised model of Qwen2.5-0.5B's shapes for 10, and the Megatron trainer for a few; prints one
# line per job (scripts/job_summary.py) and writes each run's folder under RESULTS_DIR (default
# runs/gpu-job), with nvidia-smi's memory readings every 0.5 s in memory.csv.
#
#   bash scripts/gpu-job.sh [RESULTS_DIR]
#
# GPU_JOB_TIMEOUT bounds each job (seconds, default 300). Python: as scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-runs/gpu-job}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
LIMIT=${GPU_JOB_TIMEOUT:-300}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ROLL_DEVICE_HOME=${ROLL_DEVICE_HOME:-$PWD/$RESULTS/models}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-job: skipped: no CUDA device visible to $PY"
    exit 0
fi
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c 'import ray, hydra, megatron.core' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 2
    export PYTHONPATH="$PWD/.site:$PYTHONPATH"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu \
    --format=csv,noheader,nounits -lms 500 >"$RESULTS/memory.csv" 2>/dev/null &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

COLOCATED=(rollout=hf roles.actor_infer.colocate_with=actor_train save_every=0)
failed=0
job() {  # job NAME OVERRIDES...: one run, bounded; its summary line
    local name=$1 started
    shift
    started=$(date +%s.%N)
    echo "$name start $started" >>"$RESULTS/phases.txt"
    timeout "$LIMIT" "$PY" -m roll_device.cli run "${COLOCATED[@]}" hydra.run.dir="$RESULTS/$name" "$@" \
        >"$RESULTS/$name.log" 2>&1
    local status=$?
    echo "$name end $(date +%s.%N)" >>"$RESULTS/phases.txt"
    if [ "$status" -ne 0 ]; then
        failed=1
        echo "job $name: FAILED (exit $status after $(awk "BEGIN{print int($(date +%s.%N)-$started)}")s)"
        tail -5 "$RESULTS/$name.log"
        return
    fi
    "$PY" scripts/job_summary.py "$name" "$RESULTS/$name"
}

SHAPED="$ROLL_DEVICE_HOME/qwen2.5-0.5b-shaped"
"$PY" -m roll_device.cli make-tiny-model "$SHAPED" --shapes qwen2.5-0.5b >/dev/null || exit 2

job tiny max_steps=30
job qwen2.5-0.5b-shaped model.path="$SHAPED" rollout.dtype=bfloat16 max_steps=10 algorithm.max_new_tokens=32
job megatron trainer=megatron max_steps=5
[ "$failed" -eq 0 ] && echo "gpu-job: passed (results in $RESULTS)" || echo "gpu-job: FAILED (logs in $RESULTS)"
exit "$failed"
