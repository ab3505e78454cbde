#!/usr/bin/env bash
# Installs what the tests need, then runs them: tsc, eslint, vitest against real Postgres and ZooKeeper.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
printf '\033[1m[test]\033[0m %s\n' "npm test" >&2
exec npm test
