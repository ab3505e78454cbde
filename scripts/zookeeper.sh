#!/usr/bin/env bash
# A ZooKeeper for trying `fencepost elect` in one command: installs Debian's `zookeeper` package and a
# Java runtime when missing (apt-get, as scripts/setup.sh does), then runs a standalone server on
# 127.0.0.1 on a free port (FENCEPOST_PORT_RANGE, e.g. 20000-20999, keeps it in a range) with a
# temporary data dir (scripts/zookeeper.ts), printing
#   ZK_CONNECT=127.0.0.1:<port>
# on stdout. Ctrl-C (or SIGTERM) stops it and removes the data. ZOOKEEPER_JAR names another jar.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[zookeeper]\033[0m %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# apt_install: apt-get update once, then install; waits for another apt-get's lock, bounded (APT_LOCK_TIMEOUT_S).
source scripts/apt-install.sh

if [ ! -f "${ZOOKEEPER_JAR:-/usr/share/java/zookeeper.jar}" ]; then
  say "installing ZooKeeper from Debian packages (apt-get install zookeeper)"
  apt_install zookeeper
  # Debian's package may start its own service on 2181: this script runs a server of its own.
  if command -v systemctl >/dev/null && systemctl is-active --quiet zookeeper 2>/dev/null; then
    say "stopping the zookeeper service the package just started (unused here)"
    $SUDO systemctl disable --now zookeeper >/dev/null 2>&1 || true
  fi
fi
if ! command -v java >/dev/null; then
  say "installing a Java runtime for ZooKeeper (apt-get install default-jre-headless)"
  apt_install default-jre-headless
fi
if [ ! -d node_modules ]; then
  say "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund
fi
exec node --import tsx scripts/zookeeper.ts "$@"
