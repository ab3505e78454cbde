#!/usr/bin/env bash
# Installs what the tests need, then runs them: tsc, eslint, vitest against real Postgres and ZooKeeper
# (on the machine's Node, 20); then the built package on Node 24 (scripts/smoke-node.sh: serve with
# both doors, elect and the demo, about a minute) and the HA run (tools/ha: Patroni, HAProxy and the
# proxy through failovers, about 2 minutes), kept out of npm test for their length. Each goes even
# when one before it failed; the exit status is non-zero if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/setup.sh --ha
printf '\033[1m[test]\033[0m %s\n' "npm test" >&2
unit=0
npm test || unit=$?
printf '\033[1m[test]\033[0m %s\n' "scripts/smoke-node.sh (Node 24)" >&2
smoke=0
bash scripts/smoke-node.sh || smoke=$?
printf '\033[1m[test]\033[0m %s\n' "npm run ha" >&2
ha=0
npm run ha || ha=$?
if [ "$unit" -ne 0 ] || [ "$smoke" -ne 0 ] || [ "$ha" -ne 0 ]; then
  printf '\033[1m[test]\033[0m failed: npm test exit %s, scripts/smoke-node.sh exit %s, npm run ha exit %s\n' "$unit" "$smoke" "$ha" >&2
  exit 1
fi
