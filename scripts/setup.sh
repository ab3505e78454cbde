#!/usr/bin/env bash
# Installs what fencepost needs on a fresh Debian machine: npm dependencies, and ZooKeeper from
# the OS packages when it is absent and ZK_CONNECT is unset, and Chromium for the dashboard's
# browser tests (unless CHROMIUM_PATH names one). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund
fi

if [ -z "${ZK_CONNECT:-}" ] && [ ! -f /usr/share/java/zookeeper.jar ]; then
  say "installing ZooKeeper from Debian packages (apt-get install zookeeper)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq zookeeper >/dev/null
fi
if [ -z "${ZK_CONNECT:-}" ] && ! command -v java >/dev/null; then
  say "installing a Java runtime for ZooKeeper"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq default-jre-headless >/dev/null
fi
if [ -z "${CHROMIUM_PATH:-}" ] && [ ! -x /usr/bin/chromium ]; then
  say "installing Chromium for the dashboard's browser tests (apt-get install chromium)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
