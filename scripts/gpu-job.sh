#!/usr/bin/env bash
# The whole job on a GPU through the project's embedded Ray: trainer (FSDP2 over NCCL), hosted
# reference and rollout (rollout=hf, decode graphs on) colocated on one GPU with fractional shares,
# weights synced by the colocated CUDA path. Runs the tiny default for 30 steps, a randomly
# initialised model of Qwen2.5-0.5B's shapes for 10, and the Megatron trainer for a few; prints one
# line per job (benchmarks/job_summary.py), then one per job with the GPU's peak memory in each phase
# (benchmarks/gpu_job.py), and writes each run's folder under RESULTS_DIR (default runs/gpu-job),
# with the device in device.txt and the GPU's used memory every 0.1 s in memory.csv
# (scripts/gpu_memory_log.py). `python benchmarks/gpu_job.py RESULTS_DIR` writes the docs section.
#
#   bash scripts/gpu-job.sh [RESULTS_DIR]
#
# GPU_JOBS picks the jobs, in order (default "tiny qwen2.5-0.5b-shaped megatron sync"; sync is
# benchmarks/sync_end_to_end.py on the GPU at 0.5B shapes; qwen2.5-1.5b-shaped is the larger size;
# ppo-megatron is PPO with the Megatron policy and critic, colocated).
# Two kinds in one job, nothing simulated (issue 51): train-gpu (the trainer and reference on the
# GPU, the HF rollout on CPU cores) and rollout-gpu (the HF rollout on the GPU, the trainer on CPU
# ranks), weights crossing kinds by the bridge; each runs the tiny default for MIXED_STEPS (30)
# steps twice, with rollout overlapping training (max_staleness=1, job NAME-s1) and without (NAME-s0,
# the overlap's baseline); NAME-qwen2.5-0.5b-shaped runs that model for MIXED_SHAPED_STEPS (4).
# GPU_JOB_TIMEOUT bounds each job (seconds, default 300). Python: as scripts/gpu-check.sh. Runs into
# the same RESULTS_DIR add to its memory.csv and phases.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-runs/gpu-job}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
LIMIT=${GPU_JOB_TIMEOUT:-300}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ROLL_DEVICE_HOME=${ROLL_DEVICE_HOME:-$(cd "$RESULTS" && pwd)/models}  # RESULTS relative or absolute

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-job: skipped: no CUDA device visible to $PY"
    exit 0
fi
source scripts/gpu-site.sh  # the carried wheels (.whl/)
if ! "$PY" -c 'import roll_device.commands.run' 2>"$RESULTS/imports.log"; then  # seconds, not a job's bound
    echo "gpu-job: FAILED: the job's modules do not import ($(tail -1 "$RESULTS/imports.log")): carry that" \
        "package's wheel in .whl/ (docs/install.md)"
    exit 2
fi
"$PY" -c 'import datetime, ray, torch, transformers
p = torch.cuda.get_device_properties(0)
print(f"{p.name} ({p.total_memory // 2**20} MiB), torch {torch.__version__}, Ray {ray.__version__}, "
      f"transformers {transformers.__version__}, {datetime.date.today()}")' >"$RESULTS/device.txt"
"$PY" scripts/gpu_memory_log.py "$RESULTS/memory.csv" 0.1 &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

COLOCATED=(rollout=hf roles.actor_infer.colocate_with=actor_train save_every=0)
failed=0
job() {  # job NAME OVERRIDES...: one run, bounded; its summary line
    local name=$1 started
    shift
    started=$(date +%s.%N)
    echo "$name start $started" >>"$RESULTS/phases.txt"
    timeout "$LIMIT" "$PY" -m roll_device.cli run hydra.run.dir="$RESULTS/$name" "$@" \
        >"$RESULTS/$name.log" 2>&1
    local status=$?
    echo "$name end $(date +%s.%N)" >>"$RESULTS/phases.txt"
    if [ "$status" -ne 0 ]; then
        failed=1
        echo "job $name: FAILED (exit $status after $(awk "BEGIN{print int($(date +%s.%N)-$started)}")s)"
        tail -5 "$RESULTS/$name.log"
        return
    fi
    "$PY" benchmarks/job_summary.py "$name" "$RESULTS/$name"
}

# shaped_model qwen2.5-NB-shaped: a randomly initialised model of those shapes (made once), and
# SHAPED, the overrides that run it
shaped_model() {
    local model="$ROLL_DEVICE_HOME/$1"
    "$PY" -m roll_device.cli make-tiny-model "$model" --shapes "${1%-shaped}" >/dev/null || exit 2
    SHAPED=(model.path="$model" rollout.dtype=bfloat16 algorithm.max_new_tokens=32)
}

for name in ${GPU_JOBS:-tiny qwen2.5-0.5b-shaped megatron sync}; do
    case $name in
    tiny) job tiny "${COLOCATED[@]}" max_steps=30 ;;
    megatron) job megatron "${COLOCATED[@]}" trainer=megatron max_steps=5 ;;
    ppo-megatron) job ppo-megatron "${COLOCATED[@]}" trainer=megatron algorithm=ppo max_steps=5 ;;
    train-gpu | rollout-gpu | train-gpu-qwen2.5-*-shaped | rollout-gpu-qwen2.5-*-shaped)
        if [[ $name == train-gpu* ]]; then
            sides=(roles.actor_train.device=cuda roles.reference.device=cuda roles.actor_infer.device=cpu)
        else
            sides=(roles.actor_train.device=cpu roles.reference.device=cpu roles.actor_infer.device=cuda)
        fi
        if [[ $name == *-shaped ]]; then
            shaped_model "${name#*-gpu-}"
            job "$name" rollout=hf save_every=0 "${sides[@]}" "${SHAPED[@]}" max_steps="${MIXED_SHAPED_STEPS:-4}"
        else
            for staleness in 1 0; do
                job "$name-s$staleness" rollout=hf save_every=0 "${sides[@]}" \
                    algorithm.max_staleness=$staleness max_steps="${MIXED_STEPS:-30}"
            done
        fi
        ;;
    sync)  # the weight-sync benchmark on the GPU, its lines beside the jobs' (benchmarks/gpu_job.py)
        timeout "$LIMIT" "$PY" benchmarks/sync_end_to_end.py --device cuda --sizes 0.5b \
            --groups fsdp-hf,megatron-hf --no-write >"$RESULTS/sync.log" 2>&1
        # each path's line as its group ends (kept where the time bound cuts the benchmark short)
        sed -n 's/^\[sync-e2e [0-9:]*\] \(sync_e2e .*\)/\1/p' "$RESULTS/sync.log" >"$RESULTS/sync_e2e.txt"
        echo "check sync benchmark: $(wc -l <"$RESULTS/sync_e2e.txt") path(s) measured (log: $RESULTS/sync.log)"
        ;;
    qwen2.5-*-shaped)
        shaped_model "$name"
        job "$name" "${COLOCATED[@]}" "${SHAPED[@]}" max_steps=10
        ;;
    *)
        echo "gpu-job: unknown job $name in GPU_JOBS (tiny, megatron, ppo-megatron, qwen2.5-0.5b-shaped, qwen2.5-1.5b-shaped," \
            "sync, train-gpu, rollout-gpu, train-gpu-qwen2.5-0.5b-shaped, rollout-gpu-qwen2.5-0.5b-shaped)"
        exit 2
        ;;
    esac
done
# per-phase peak memory per job (benchmarks/gpu_job.py; `--no-write`: docs/ are rewritten by hand)
"$PY" benchmarks/gpu_job.py "$RESULTS" --no-write 2>&1 | sed 's/^/check /'
[ "$failed" -eq 0 ] && echo "gpu-job: passed (results in $RESULTS)" || echo "gpu-job: FAILED (logs in $RESULTS)"
exit "$failed"
