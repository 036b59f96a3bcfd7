# Sourced by scripts/gpu-check.sh and scripts/gpu-job.sh, with PY set, in the checkout's root: the
# packages a GPU machine that cannot fetch any lacks, made importable.
# - The wheels carried in .whl/ (Ray, Hydra, megatron-core and their missing dependencies:
#   docs/install.md) are installed into .site/ and put on PYTHONPATH, where those packages are missing.
# - psutil, which the project imports (roll_device/cluster/), from Ray's own copy where the machine
#   has none: Ray vendors it in ray/thirdparty_files and puts that on sys.path only once imported,
#   after the project's modules that import psutil first.
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c 'import ray, hydra, megatron.core' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 2
    export PYTHONPATH="$PWD/.site:$PYTHONPATH"
fi
if ! "$PY" -c 'import psutil' 2>/dev/null; then
    vendored=$("$PY" -c 'import os, ray; print(os.path.join(os.path.dirname(ray.__file__), "thirdparty_files"))' \
        2>/dev/null) && export PYTHONPATH="$vendored:$PYTHONPATH"
fi
