#!/usr/bin/env bash
# Every GPU path of the project in one command, on a machine with a CUDA (or ROCm) build of torch:
# the `gpu`-marked tests (platform operations, graphs, IPC, the HF decode graph runner, weight sync,
# FSDP2 and Megatron-core steps), the GPU benchmark columns (benchmarks/gpu.py) and, where Ray is
# importable, the whole job through Ray (scripts/gpu-job.sh, one line per job). Needs no vLLM.
# Prints one summary line per check and writes the results to RESULTS_DIR (default
# runs/gpu-check): gpu-tests.xml, gpu-tests.log, gpu-benchmark.json, gpu-benchmark.log, job/,
# summary.txt. Without a GPU it says so and exits 0. GPU_TESTS_TIMEOUT (seconds, default 1200) bounds
# the test run; GPU_BENCH_ARGS is passed to benchmarks/gpu.py (e.g. "--rounds 3").
#
#   bash scripts/gpu-check.sh [RESULTS_DIR]
#
# Python: .venv/bin/python when present, else python3 (override with PYTHON=...). Wheels placed in
# .whl/ (Ray, hydra-core, omegaconf, antlr4, megatron-core: see docs/install.md) are installed into
# .site/ and put on PYTHONPATH when those packages are missing (scripts/gpu-site.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:-runs/gpu-check}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    build=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "no torch")
    echo "gpu-check: skipped: no CUDA device visible to $PY (torch $build)" | tee "$RESULTS/summary.txt"
    exit 0
fi
source scripts/gpu-site.sh  # the carried wheels (.whl/)
"$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"gpu-check: {p.name}, torch {torch.__version__}")' \
    | tee "$RESULTS/summary.txt"

mapfile -t TESTS < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
# Per-test limit where pytest-timeout is installed, and a limit on the whole test run either way.
PER_TEST=$("$PY" -c 'import pytest_timeout' 2>/dev/null && echo "--timeout=300")
timeout "${GPU_TESTS_TIMEOUT:-1200}" "$PY" -m pytest -q -p no:cacheprovider -m gpu -o addopts="$PER_TEST" \
    "${TESTS[@]}" --junitxml="$RESULTS/gpu-tests.xml" >"$RESULTS/gpu-tests.log" 2>&1
tests_status=$?
"$PY" scripts/junit_summary.py "$RESULTS/gpu-tests.xml" | tee -a "$RESULTS/summary.txt"
[ -s "$RESULTS/gpu-tests.xml" ] || tail -40 "$RESULTS/gpu-tests.log"

"$PY" benchmarks/gpu.py ${GPU_BENCH_ARGS:-} --results "$RESULTS/gpu-benchmark.json" 2>"$RESULTS/gpu-benchmark.log" \
    | tee -a "$RESULTS/summary.txt"
bench_status=$?
[ "$bench_status" -eq 0 ] || { tail -30 "$RESULTS/gpu-benchmark.log"; echo "check gpu benchmark: FAILED"; } \
    | tee -a "$RESULTS/summary.txt"

job_status=0
if "$PY" -c 'import ray' 2>/dev/null; then
    bash scripts/gpu-job.sh "$RESULTS/job" | tee -a "$RESULTS/summary.txt"
    job_status=$?
else
    echo "check gpu job: skipped (Ray is not importable: see docs/install.md for the carried wheel)" \
        | tee -a "$RESULTS/summary.txt"
fi

if [ "$tests_status" -eq 0 ] && [ "$bench_status" -eq 0 ] && [ "$job_status" -eq 0 ]; then
    echo "gpu-check: passed (results in $RESULTS)" | tee -a "$RESULTS/summary.txt"
    exit 0
fi
echo "gpu-check: FAILED (tests exit $tests_status, benchmark exit $bench_status, job exit $job_status; logs in $RESULTS)" \
    | tee -a "$RESULTS/summary.txt"
exit 1
