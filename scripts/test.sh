#!/usr/bin/env bash
# Installs what the tests need, then runs them, each stage even when one before it failed (the exit
# status is non-zero if any did):
#   npm test              tsc, eslint, vitest against real Postgres and ZooKeeper (the machine's Node, 20)
#   npm run test:system   whole-system runs: chaos runs under a nemesis, the release tarball installed
#                         into a clean folder (a few minutes)
#   scripts/smoke-node.sh the built package on Node 24: serve with both doors, elect, the demo (about a minute)
#   npm run ha            tools/ha: Patroni, HAProxy and the proxy through failovers (about 2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/setup.sh --ha
failed=()
stage() {
  printf '\033[1m[test]\033[0m %s\n' "$*" >&2
  "$@" || failed+=("$* (exit $?)")
}
stage npm test
# dist/ was built by npm test's global setup from these sources.
stage env FENCEPOST_TEST_SKIP_BUILD=1 npm run test:system
stage bash scripts/smoke-node.sh
stage npm run ha
if [ "${#failed[@]}" -ne 0 ]; then
  printf '\033[1m[test]\033[0m failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
