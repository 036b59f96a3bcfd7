# Sourced by scripts/gpu-check.sh and scripts/gpu-job.sh, with PY set, in the checkout's root: the
# wheels carried in .whl/ (Ray, Hydra, megatron-core and their missing dependencies, for a GPU
# machine that cannot fetch them: docs/install.md) installed into .site/ and put on PYTHONPATH,
# where those packages are missing.
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c 'import ray, hydra, megatron.core' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 2
    export PYTHONPATH="$PWD/.site:$PYTHONPATH"
fi
