#!/usr/bin/env bash
# Installs what fencepost needs on a fresh Debian machine, and says what it is doing:
#   always        npm dependencies (npm ci), ZooKeeper + a Java runtime from Debian packages when
#                 absent and ZK_CONNECT is unset
#   with --test   also Chromium (dashboard browser tests, unless CHROMIUM_PATH names one),
#                 docker-compose (validates docker-compose.yml), Prometheus (its promtool checks
#                 dashboards/: the scrape config, the alert rules and their unit tests), the SQL
#                 endpoint's clients (psql, pgbench, pg_dump, psycopg2, pgx with Go) and Postgres
#                 15's server (pg_dump 15 refuses a newer one), PgBouncer, and etcd with etcdctl
#                 (fencing tokens from `etcdctl lock`, docs/integrations.md)
#   with --bench  also the benchmark's load generators: wrk (HTTP) and pgbench (Postgres), and
#                 PgBouncer (the SQL endpoint's reference protocol proxy)
#   with --ha     also the HA run's cluster (npm run ha, tools/ha): Patroni with its ZooKeeper
#                 client (python3-kazoo), HAProxy, and Postgres 15's server binaries
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# apt_install: apt-get update once, then install; waits for another apt-get's lock, bounded (APT_LOCK_TIMEOUT_S).
source scripts/apt-install.sh

# apt_install_unused_service PACKAGE SERVICE: where an init system runs, Debian's package also
# starts its service, which nothing here uses (each test or bench starts a server of its own, on a
# port of its own): stop the one installed just now.
apt_install_unused_service() {
  apt_install "$1"
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$2" 2>/dev/null; then
    say "stopping the $2 service the package just started (unused)"
    $SUDO systemctl disable --now "$2" >/dev/null 2>&1 || true
  fi
}

# Debian's Postgres server package creates and starts a cluster "main" on a fresh install; nothing
# here uses it (each test, bench or HA run starts Postgres of its own), so drop one created just now.
apt_install_postgres_server() {
  had_clusters=$(ls /etc/postgresql 2>/dev/null || true)
  apt_install "$1"
  if [ -z "$had_clusters" ] && command -v pg_lsclusters >/dev/null; then
    pg_lsclusters -h | while read -r version cluster _; do
      say "dropping the cluster $version/$cluster the package just created (unused)"
      $SUDO pg_dropcluster --stop "$version" "$cluster"
    done
  fi
}

# PgBouncer: a test checks how the proxy reports one between itself and Postgres, and the SQL
# endpoint's bench measures it (transaction pooling) beside the endpoint.
install_pgbouncer() {
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    say "installing PgBouncer for the tests and the SQL endpoint's bench (apt-get install pgbouncer)"
    apt_install_unused_service pgbouncer pgbouncer
  fi
}

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund
fi

if [ -z "${ZK_CONNECT:-}" ]; then
  if [ ! -f /usr/share/java/zookeeper.jar ]; then
    say "installing ZooKeeper from Debian packages (apt-get install zookeeper)"
    apt_install zookeeper
  fi
  if ! command -v java >/dev/null; then
    say "installing a Java runtime for ZooKeeper"
    apt_install default-jre-headless
  fi
fi

if [ "${1:-}" = "--test" ]; then
  if [ -z "${CHROMIUM_PATH:-}" ] && [ ! -x /usr/bin/chromium ]; then
    say "installing Chromium for the dashboard's browser tests (apt-get install chromium)"
    apt_install chromium
  fi
  # The SQL endpoint's tests drive it with clients nobody here wrote: psql, pgbench (Debian ships it
  # with the server package, see --bench) and Python's psycopg2, psycopg 3 and asyncpg (run as
  # /usr/bin/python3): each sends its own message orders and startup parameters.
  if ! command -v psql >/dev/null; then
    say "installing psql for the SQL endpoint's tests (apt-get install postgresql-client)"
    apt_install postgresql-client
  fi
  if ! pgbench --version >/dev/null 2>&1; then
    say "installing pgbench for the SQL endpoint's tests (apt-get install postgresql; see --bench)"
    apt_install_postgres_server postgresql
  fi
  if ! /usr/bin/python3 -c 'import psycopg2' >/dev/null 2>&1; then
    say "installing psycopg2 for the SQL endpoint's tests (apt-get install python3-psycopg2)"
    apt_install python3-psycopg2
  fi
  # pg_dump (postgresql-client, above) is version 15 and aborts against a newer server: its tests,
  # and pg_stat_statements' (a preloaded library), run Debian's Postgres 15 server, a cluster of
  # their own (test/support/debian-postgres.ts).
  if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
    say "installing Postgres 15's server for the SQL endpoint's pg_dump tests (apt-get install postgresql-15)"
    apt_install_postgres_server postgresql-15
  fi
  # pgx, Go's Postgres driver: a test builds a writer on it offline, in GOPATH mode, from Debian's
  # Go and pgx v4 source (test/fixtures/pgx-writer).
  if [ ! -x /usr/bin/go ] || [ ! -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ]; then
    say "installing Go and pgx for the SQL endpoint's tests (apt-get install golang-go golang-github-jackc-pgx-v4-dev)"
    apt_install golang-go golang-github-jackc-pgx-v4-dev
  fi
  for driver in psycopg asyncpg; do
    if ! /usr/bin/python3 -c "import $driver" >/dev/null 2>&1; then
      say "installing $driver for the SQL endpoint's tests (apt-get install python3-$driver)"
      apt_install "python3-$driver"
    fi
  done
  if ! command -v docker-compose >/dev/null; then
    say "installing docker-compose (the tests validate docker-compose.yml with it)"
    apt_install docker-compose
  fi
  install_pgbouncer
  # A test runs docs/integrations.md's `etcdctl lock` commands against an etcd of its own.
  if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    say "installing etcd and etcdctl for the etcd lock's test (apt-get install etcd-server etcd-client)"
    apt_install_unused_service etcd-server etcd
    apt_install etcd-client
  fi
  # Debian ships promtool only with the server.
  if ! command -v promtool >/dev/null; then
    say "installing Prometheus for promtool (the tests check dashboards/prometheus*.yml with it)"
    apt_install_unused_service prometheus prometheus
  fi
fi

if [ "${1:-}" = "--bench" ]; then
  if ! command -v wrk >/dev/null; then
    say "installing wrk, the benchmark's HTTP load generator (apt-get install wrk)"
    apt_install wrk
  fi
  # Debian ships pgbench with the server (postgresql-NN), not postgresql-client: /usr/bin/pgbench is
  # only a wrapper until a server package is installed.
  if ! pgbench --version >/dev/null 2>&1; then
    say "installing pgbench, the benchmark's Postgres load generator (apt-get install postgresql: Debian ships pgbench with the server)"
    apt_install_postgres_server postgresql
  fi
  install_pgbouncer
fi

if [ "${1:-}" = "--ha" ]; then
  # The HA run (tools/ha) starts three Patroni nodes of its own, each running Debian's Postgres 15
  # from /usr/lib/postgresql/15/bin, on ZooKeeper (python3-kazoo), behind HAProxy.
  if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
    say "installing Postgres 15's server binaries for the HA run (apt-get install postgresql-15)"
    apt_install_postgres_server postgresql-15
  fi
  if ! command -v patroni >/dev/null || ! /usr/bin/python3 -c 'import kazoo' >/dev/null 2>&1; then
    say "installing Patroni and its ZooKeeper client for the HA run (apt-get install patroni python3-kazoo)"
    apt_install_unused_service patroni patroni
    apt_install python3-kazoo
  fi
  if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
    say "installing HAProxy for the HA run (apt-get install haproxy)"
    apt_install_unused_service haproxy haproxy
  fi
fi
