#!/usr/bin/env bash
# Installs what the demo needs (npm deps; ZooKeeper from Debian packages unless ZK_CONNECT), then
# runs the forced-pause demo: a frozen leader comes back as a zombie and its write is fenced off.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
printf "\033[1m[demo]\033[0m %s\n" "fencepost demo $*" >&2
exec node --import tsx src/cli/main.ts demo "$@"
