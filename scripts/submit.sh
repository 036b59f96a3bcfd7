#!/usr/bin/env bash
# Submit a roll-device run to an existing Ray cluster with the plain Ray CLI: the same job as
# `roll-device submit [--command plan] [overrides]` (this checkout as working directory, the
# overrides passed through, logs streamed, the job's exit status returned).
#
#   RAY_ADDRESS=http://<head>:8265 scripts/submit.sh [run|plan] [overrides...]
#
# On the cluster `cluster=local` (the default) joins the job's cluster.
set -euo pipefail
command=run
if [[ "${1:-}" == run || "${1:-}" == plan ]]; then
  command=$1
  shift
fi
cd "$(dirname "$0")/.."
: "${RAY_ADDRESS:?set RAY_ADDRESS to the cluster dashboard, e.g. http://127.0.0.1:8265}"
# As roll-device submit: this machine's Ray token, if any, goes with the submission (Ray's Jobs
# CLI sends none unless RAY_AUTH_MODE=token); the run's outputs go to ~/roll-device/outputs on the
# head, not into Ray's temporary copy of the checkout (${HOME} is expanded there, by Ray).
if [[ -z "${RAY_AUTH_MODE:-}" && ( -n "${RAY_AUTH_TOKEN:-}" || -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ) ]]; then
  export RAY_AUTH_MODE=token
fi
env_vars="\"PYTHONUNBUFFERED\": \"1\", \"ROLL_DEVICE_OUTPUTS\": \"\${HOME}/roll-device/outputs\""
env_vars+=", \"ROLL_DEVICE_SUBMITTED_TO\": \"$RAY_ADDRESS\""
exec ray job submit --address "$RAY_ADDRESS" --working-dir . \
  --runtime-env-json "{\"env_vars\": {$env_vars}}" \
  -- python -m roll_device.cli "$command" "$@"
