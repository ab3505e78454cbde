#!/usr/bin/env bash
# Installs what the tests need, then runs them (type-check + vitest against real Postgres and ZooKeeper).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${ZK_CONNECT:-}" ] || [ "${FENCEPOST_TEST_COMPOSE:-1}" = 1 ]; then
  if ! command -v docker-compose >/dev/null; then
    printf '\033[1m[setup]\033[0m %s\n' "installing docker-compose (to validate docker-compose.yml)" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker-compose >/dev/null || true
  fi
fi
printf '\033[1m[test]\033[0m %s\n' "npm test" >&2
exec npm test
