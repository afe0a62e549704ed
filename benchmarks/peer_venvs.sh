#!/usr/bin/env bash
# Make the peers' virtualenvs of one benchmark: `peer_venvs.sh DIR` reads DIR/requirements.txt
# and makes one virtualenv per line under DIR/.venv/ (ignored by the repository's `.venv/`
# pattern), named for the package (ray[data] -> .venv/ray), apart from the project's .venv and
# from each other, so that their pins cannot clash and one that fails to install leaves the
# others usable. Every install goes through DIR/constraints.txt (torch pinned to the local CPU
# wheel), or DIR/constraints-<name>.txt where a peer has one (a peer whose own pins exclude the
# shared ones: Daft's pyarrow). A peer that fails to install leaves .venv/failed-<name>.txt (pip's last lines), which
# the benchmark reports; the others are installed all the same. Idempotent: a virtualenv whose
# .installed matches its line is kept. Used by peers/setup.sh and peers_mixing/setup.sh.
set -uo pipefail
cd "$1"
python="${PYTHON:-python3}"
mkdir -p .venv
status=0
while read -r requirement; do
  case "$requirement" in '' | '#'*) continue ;; esac
  name="${requirement%%[=<>!~ ]*}"
  name="${name%%\[*}" # ray[data] -> ray
  venv=".venv/$name"
  [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$requirement" ] && continue
  rm -f ".venv/failed-$name.txt"
  constraints=constraints.txt
  [ -f "constraints-$name.txt" ] && constraints="constraints-$name.txt"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints")
  if { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"; } &&
    "${pip[@]}" torch==2.13.0 pyarrow numpy "$requirement" >".venv/install-$name.log" 2>&1; then
    echo "$requirement" >"$venv/.installed"
  else
    tail -n 20 ".venv/install-$name.log" >".venv/failed-$name.txt"
    echo "could not install $requirement: see $PWD/.venv/failed-$name.txt" >&2
    status=2
  fi
done <requirements.txt
exit "$status"
