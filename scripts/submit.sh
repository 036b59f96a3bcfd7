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
exec ray job submit --address "$RAY_ADDRESS" --working-dir . \
  --runtime-env-json '{"env_vars": {"PYTHONUNBUFFERED": "1"}}' \
  -- python -m roll_device.cli "$command" "$@"
