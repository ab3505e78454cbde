#!/usr/bin/env bash
# Installs what the tests need, then runs them: tsc, eslint, vitest against real Postgres and ZooKeeper;
# then the HA run (tools/ha: Patroni, HAProxy and the proxy through failovers, about 2 minutes), kept
# out of npm test for its length.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/setup.sh --ha
printf '\033[1m[test]\033[0m %s\n' "npm test" >&2
npm test
printf '\033[1m[test]\033[0m %s\n' "npm run ha" >&2
exec npm run ha
