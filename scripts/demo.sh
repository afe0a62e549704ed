#!/usr/bin/env bash
# The main job: set up, generate a local Parquet dataset, load it with 0 and 2 workers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh cli
exec .venv/bin/tdu demo "$@"
