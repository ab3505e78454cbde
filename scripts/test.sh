#!/usr/bin/env bash
# Installs what the tests need, then runs them: tsc, eslint, vitest against real Postgres and ZooKeeper;
# then the HA run (tools/ha: Patroni, HAProxy and the proxy through failovers, about 2 minutes), kept
# out of npm test for its length. The HA run goes even when npm test failed; the exit status is
# non-zero if either did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/setup.sh --ha
printf '\033[1m[test]\033[0m %s\n' "npm test" >&2
unit=0
npm test || unit=$?
printf '\033[1m[test]\033[0m %s\n' "npm run ha" >&2
ha=0
npm run ha || ha=$?
if [ "$unit" -ne 0 ] || [ "$ha" -ne 0 ]; then
  printf '\033[1m[test]\033[0m failed: npm test exit %s, npm run ha exit %s\n' "$unit" "$ha" >&2
  exit 1
fi
