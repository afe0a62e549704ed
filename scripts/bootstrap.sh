#!/usr/bin/env bash
# Create .venv and install the project with the given extras; idempotent (skips when unchanged).
# Every install goes through constraints.txt, which pins torch==2.13.0 (a local CPU wheel):
# without it, some dependency would pull a newer torch with gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.tdu-installed-$extras"
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip -c constraints.txt
  .venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[$extras]"
  echo "$want" >"$stamp"
fi
# The package's bytecode, as pip writes it for an installed package: with PYTHONDONTWRITEBYTECODE
# set (this kind of machine sets it), every new process (a spawn worker, a rank, a test's
# subprocess) would compile the editable sources again, ~0.4 s each (docs/benchmarks.md, a
# spawned worker's start). Only what changed is compiled; a stale file is never used.
.venv/bin/python -m compileall -q src
