#!/usr/bin/env bash
# Installs npm dependencies if needed, builds dist/, then runs the fencing proxy (embedded Postgres unless DATABASE_URL).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  printf '\033[1m[setup]\033[0m %s\n' "installing npm dependencies (npm ci)" >&2
  npm ci --no-audit --no-fund
fi
npm run build --silent  # dist/ from the current sources
exec node bin/fencepost.js serve "$@"
