#!/usr/bin/env bash
# Print the software stack this machine's accelerator needs (cpu, cuda, rocm or npu) on the first
# line and why on the second; scripts/setup.sh installs that stack. Pure bash: it runs before any
# venv exists. ROLL_DEVICE_STACK=cpu|cuda|rocm|npu skips detection. The probes can be pointed
# elsewhere (the tests use stand-ins): ROLL_DEVICE_PROBE_ROOT prefixes /dev, /proc, /opt/rocm and
# /usr/local/Ascend; the tools (nvidia-smi, rocminfo, rocm-smi, npu-smi) are found on PATH;
# ASCEND_TOOLKIT_HOME names the CANN toolkit as CANN's set_env.sh does.
# Exit 2, nothing printed on stdout: an unknown ROLL_DEVICE_STACK, or an Ascend NPU without CANN.
set -euo pipefail
root=${ROLL_DEVICE_PROBE_ROOT:-}

has() { command -v "$1" >/dev/null 2>&1; }
probe() { timeout 20 "$@" 2>/dev/null; }  # a tool of a broken driver may hang or fail

nvidia() {
  local gpus
  if has nvidia-smi && gpus=$(probe nvidia-smi -L | grep -c '^GPU ') && [ "$gpus" -gt 0 ]; then
    echo "NVIDIA driver: nvidia-smi -L lists $gpus GPU(s)"
  elif [ -e "$root/dev/nvidia0" ] && [ -d "$root/proc/driver/nvidia" ]; then
    echo "NVIDIA driver: $root/dev/nvidia0 and $root/proc/driver/nvidia"
  else
    return 1
  fi
}

amd() {
  [ -e "$root/dev/kfd" ] || return 1
  local gfx
  if has rocminfo && gfx=$(probe rocminfo | grep -om1 'gfx[0-9a-f]*'); then
    echo "AMD ROCm: $root/dev/kfd, rocminfo lists $gfx"
  elif has rocm-smi && probe rocm-smi >/dev/null; then
    echo "AMD ROCm: $root/dev/kfd, rocm-smi answers"
  elif [ -d "$root/opt/rocm" ]; then
    echo "AMD ROCm: $root/dev/kfd and $root/opt/rocm"
  else
    return 1
  fi
}

ascend_driver() {
  local dev
  for dev in "$root"/dev/davinci[0-9]*; do
    [ -e "$dev" ] && echo "Ascend driver: $dev" && return 0
  done
  has npu-smi && probe npu-smi info >/dev/null && echo "Ascend driver: npu-smi info answers"
}

cann() {  # the toolkit CANN's set_env.sh exports, else its default install folder
  local dir
  for dir in "${ASCEND_TOOLKIT_HOME:-}" "$root/usr/local/Ascend/ascend-toolkit/latest"; do
    [ -n "$dir" ] && [ -d "$dir" ] && echo "CANN toolkit $dir" && return 0
  done
  return 1
}

npu() {  # $1: why the stack is npu; torch_npu without CANN breaks `import torch` itself
  local toolkit
  if toolkit=$(cann); then
    echo npu
    echo "$1, $toolkit"
    return 0
  fi
  cat >&2 <<EOF
detect-stack: $1, but no CANN toolkit (no folder at ASCEND_TOOLKIT_HOME or
$root/usr/local/Ascend/ascend-toolkit/latest), and torch_npu cannot load without it.
Install CANN (toolkit, kernels and NNAL of the release in docs/install.md's table) from Huawei's
Ascend site, run \`source /usr/local/Ascend/ascend-toolkit/set_env.sh\`, then run setup again; or
set ROLL_DEVICE_STACK=cpu for the CPU stack. Nothing has been installed.
EOF
  exit 2
}

case "${ROLL_DEVICE_STACK:-}" in
  "") ;;
  npu) npu "set by ROLL_DEVICE_STACK=npu" && exit 0 ;;
  cpu | cuda | rocm)
    printf '%s\nset by ROLL_DEVICE_STACK=%s\n' "$ROLL_DEVICE_STACK" "$ROLL_DEVICE_STACK"
    exit 0
    ;;
  *)
    echo "detect-stack: ROLL_DEVICE_STACK='$ROLL_DEVICE_STACK' is not a stack: use cpu, cuda, rocm or npu," \
      "or unset it to detect the machine's accelerator" >&2
    exit 2
    ;;
esac

if why=$(nvidia); then
  printf 'cuda\n%s\n' "$why"
elif why=$(amd); then
  printf 'rocm\n%s\n' "$why"
elif why=$(ascend_driver); then
  npu "$why"
else
  printf 'cpu\n%s\n' "no accelerator found (no NVIDIA driver, AMD /dev/kfd or Ascend /dev/davinci*)"
fi
