#!/usr/bin/env bash
# The whole test suite: set up, lint, types, docs, tests. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
scripts/services.sh  # Azurite (npm), PostgreSQL (apt): servers pip cannot install
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff";   ruff check . && ruff format --check .
echo "== mypy";   mypy
echo "== docs";   NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet -d "$(mktemp -d)"
# Two test processes, each taking whole files (module fixtures such as torchrun jobs run once);
# TDU_TEST_PROCESSES=0 runs in this process alone.
echo "== pytest"; pytest -q -p no:cacheprovider -n "${TDU_TEST_PROCESSES:-2}" --dist loadfile "$@"
