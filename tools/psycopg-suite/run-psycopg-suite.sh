#!/usr/bin/env bash
# Run psycopg 3's own test suite (tag 3.1.7, against the installed Debian python3-psycopg 3.1.7)
# twice — straight to PostgreSQL 15 and through fencepost's SQL endpoint — and compare the two.
#
#   bash tools/psycopg-suite/run-psycopg-suite.sh   # everything: deps, Postgres, proxy, both runs, comparison (~40 min)
#   ONLY=direct|endpoint ...                        # one run only (the other's results are kept from before)
#   PYTEST_ARGS='tests/test_cursor.py' ...          # a subset instead of the whole suite
#   QUICK=1 ...                                     # leave out psycopg's `slow` tests (most pool timing tests, leak tests)
#   RERUNS=3 ...                                    # runs again, each way, of each test that failed only through the endpoint
#   FENCEPOST_*=... ...                             # passed on to the proxy, e.g. FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS=0
#   ONLY=serve ...                                  # start Postgres and the proxy, print both DSNs, wait (Ctrl-C/SIGTERM stops them)
#
# Everything lives under $BASE (default /tmp/h-psycopg): clones, the Postgres data dir, logs,
# results/{direct,endpoint}.jsonl (one JSON line per test), results/comparison.txt.
# Ports: Postgres 25499, SQL endpoint 25432, proxy HTTP 28099. Every server started here is
# stopped on exit (by the pids this script recorded).
#
# Roles: direct runs log in as `psy_direct`, a non-superuser with the same grants the endpoint's
# client login `fencepost_client` gets (CREATE/TEMP on the database, CREATE on schema public), so
# differences are the endpoint's, not privileges'. The two runs use two databases of one cluster
# (fp_direct, fp_endpoint: the endpoint serves only its DATABASE_URL's), so leftovers of one run
# cannot fail the other.
set -euo pipefail

BASE=${BASE:-/tmp/h-psycopg}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_PORT=${PG_PORT:-25499}
EP_PORT=${EP_PORT:-25432}
HTTP_PORT=${HTTP_PORT:-28099}
PGDATA=$BASE/pgdata
PGSOCK=$BASE/pgsock
LOGS=$BASE/logs
RESULTS=$BASE/results
FENCEPOST_SRC=${FENCEPOST_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}   # this checkout, cloned (its committed HEAD)
PSYCOPG_MIRROR=${PSYCOPG_MIRROR:-https://github.com/psycopg/psycopg}   # or a local mirror
PSYCOPG_TAG=3.1.7
SUPER_PW=fp-super-pw
DIRECT_PW=psy-direct-pw
PER_TEST_TIMEOUT=${PER_TEST_TIMEOUT:-60}
RUN_TIMEOUT=${RUN_TIMEOUT:-2400}
RERUNS=${RERUNS:-3}   # each test that passes direct and fails through the endpoint runs again this many times each way
PYTEST_MARKERS=${PYTEST_MARKERS:-not mypy and not proxy}   # mypy: slow, no DB; proxy: needs pproxy (not packaged)
[ "${QUICK:-0}" = 1 ] && PYTEST_MARKERS="$PYTEST_MARKERS and not slow"   # QUICK=1: without psycopg's slow tests (pool timing, leaks)
PYTEST_ARGS=${PYTEST_ARGS:-tests}
ONLY=${ONLY:-both}
PY=/usr/bin/python3

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (Postgres runs as the postgres OS user via runuser, apt installs)"
mkdir -p "$BASE" "$LOGS" "$RESULTS"

# ---------------------------------------------------------------- dependencies (Debian packages, npm)
need_pkgs=()
for p in postgresql-15 postgresql-contrib python3-psycopg python3-psycopg-pool python3-pytest python3-pytest-asyncio python3-pytest-timeout git; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "apt-get install ${need_pkgs[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
command -v node >/dev/null || die "node (20 or 24) is needed for the proxy"

if [ ! -d "$BASE/fencepost/.git" ]; then
  log "cloning fencepost from $FENCEPOST_SRC"
  git clone -q "$FENCEPOST_SRC" "$BASE/fencepost"
fi
# A clone kept from an earlier run follows the source's HEAD (and is built again).
want=$(git -C "$FENCEPOST_SRC" rev-parse HEAD)
if [ "$(git -C "$BASE/fencepost" rev-parse HEAD)" != "$want" ]; then
  log "checking out $want in $BASE/fencepost"
  git -C "$BASE/fencepost" fetch -q "$FENCEPOST_SRC" "$want"
  git -C "$BASE/fencepost" checkout -q --detach "$want"
  rm -rf "$BASE/fencepost/dist"
fi
if [ ! -d "$BASE/fencepost/node_modules" ] || [ ! -f "$BASE/fencepost/dist/cli/main.js" ]; then
  log "npm ci in $BASE/fencepost (builds dist/)"
  (cd "$BASE/fencepost" && npm ci --no-audit --no-fund >"$LOGS/npm-ci.log" 2>&1) || die "npm ci: see $LOGS/npm-ci.log"
fi
if [ ! -d "$BASE/psycopg/.git" ]; then
  log "cloning psycopg from $PSYCOPG_MIRROR"
  git clone -q "$PSYCOPG_MIRROR" "$BASE/psycopg"
fi
(cd "$BASE/psycopg" && [ "$(git describe --tags --exact-match 2>/dev/null)" = "$PSYCOPG_TAG" ] || git checkout -q "$PSYCOPG_TAG")

# The helper plugin and comparison live beside this script; fail early if absent.
TOOLS=$(cd "$(dirname "$0")" && pwd)
[ -f "$TOOLS/outcomes_plugin.py" ] && [ -f "$TOOLS/compare.py" ] || die "$TOOLS/outcomes_plugin.py and compare.py are needed"

# The tests must import the installed psycopg 3.1.7, not the source tree's (pytest puts the
# checkout's root on sys.path; its psycopg/ folder has no __init__.py, so the installed package wins).
got=$(cd "$BASE/psycopg" && $PY -c 'import sys; sys.path.insert(0, "."); import psycopg, psycopg_pool; print(psycopg.__version__, psycopg.__file__)')
case "$got" in
  "3.1.7 /usr/lib/python3/dist-packages/"*) log "psycopg under test: $got (impl $($PY -c 'import psycopg; print(psycopg.pq.__impl__)'))" ;;
  *) die "psycopg imported from the wrong place: $got" ;;
esac

# ---------------------------------------------------------------- servers
PROXY_PID=
cleanup() {
  set +e
  if [ -n "$PROXY_PID" ] && kill -0 "$PROXY_PID" 2>/dev/null; then
    log "stopping the proxy (pid $PROXY_PID)"
    kill -TERM "$PROXY_PID"
    for _ in $(seq 1 30); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$PROXY_PID" 2>/dev/null && kill -KILL "$PROXY_PID"
  fi
  if [ -f "$PGDATA/postmaster.pid" ]; then
    log "stopping Postgres"
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A Postgres left by an earlier, interrupted run of this script (its own data dir only).
if [ -f "$PGDATA/postmaster.pid" ]; then
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1 || true
fi
for port in "$PG_PORT" "$EP_PORT" "$HTTP_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then die "port $port is in use"; fi
done

log "initdb $PGDATA (PostgreSQL 15, port $PG_PORT)"
rm -rf "$PGDATA" "$PGSOCK"
mkdir -p "$PGDATA" "$PGSOCK"
chown postgres:postgres "$PGDATA" "$PGSOCK"
chmod 700 "$PGDATA"
runuser -u postgres -- "$PG_BIN/initdb" -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$LOGS/initdb.log" 2>&1 || die "initdb: see $LOGS/initdb.log"
cat >>"$PGDATA/postgresql.conf" <<EOF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGSOCK'
max_connections = 300
max_prepared_transactions = 10   # psycopg's two-phase commit tests run straight to Postgres
fsync = off                      # a throwaway test cluster
synchronous_commit = off
full_page_writes = off
password_encryption = 'scram-sha-256'
EOF
touch "$LOGS/postgres.log" && chown postgres "$LOGS/postgres.log"
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$LOGS/postgres.log" -w start >/dev/null || die "Postgres did not start: see $LOGS/postgres.log"

psql_su() { runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h "$PGSOCK" -p "$PG_PORT" -U postgres "$@"; }
psql_su -d postgres <<EOF
ALTER ROLE postgres PASSWORD '$SUPER_PW';
CREATE ROLE psy_direct LOGIN PASSWORD '$DIRECT_PW' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE fp_direct;
CREATE DATABASE fp_endpoint;
EOF
for db in fp_direct fp_endpoint; do
  # hstore made here, so the tests' "create extension if not exists hstore" needs no privilege
  psql_su -d "$db" -c 'CREATE EXTENSION IF NOT EXISTS hstore'
done
grant_sql() { # the same grants for psy_direct (direct) and fencepost_client (endpoint)
  echo "GRANT CREATE, TEMPORARY ON DATABASE $1 TO $2; GRANT USAGE, CREATE ON SCHEMA public TO $2;"
}
psql_su -d fp_direct -c "$(grant_sql fp_direct psy_direct)"

run_suite() { # name dsn [node ids…]: the whole selection (PYTEST_ARGS) without node ids
  local name=$1 dsn=$2 out=$RESULTS/$1.jsonl rc=0
  shift 2
  local select=("$@")
  [ ${#select[@]} -gt 0 ] || read -r -a select <<<"$PYTEST_ARGS"
  rm -f "$out"
  rm -rf "$BASE/pytest-cache-$name"
  log "running psycopg's tests $name (log: $LOGS/pytest-$name.log)"
  local t0=$SECONDS
  (
    cd "$BASE/psycopg"
    unset PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD PGOPTIONS PGSERVICE PGSSLMODE PGAPPNAME
    export PSYCOPG_TEST_DSN="$dsn" OUTCOMES_FILE="$out" PYTHONPATH="$TOOLS" PYTHONDONTWRITEBYTECODE=1
    timeout -k 30 "$RUN_TIMEOUT" $PY -m pytest "${select[@]}" -p outcomes_plugin -m "$PYTEST_MARKERS" \
      --timeout="$PER_TEST_TIMEOUT" -o cache_dir="$BASE/pytest-cache-$name" -q -rfE --no-header \
      >"$LOGS/pytest-$name.log" 2>&1
  ) || rc=$?
  log "$name: pytest exit $rc in $((SECONDS - t0)) s: $(grep -E '(passed|failed|error|skipped).* in [0-9.]+s' "$LOGS/pytest-$name.log" | tail -1)"
  [ -s "$out" ] || die "$name: no results (see $LOGS/pytest-$name.log)"
}

DIRECT_DSN="host=127.0.0.1 port=$PG_PORT dbname=fp_direct user=psy_direct password=$DIRECT_PW"
ENDPOINT_DSN="host=127.0.0.1 port=$EP_PORT dbname=fp_endpoint user=psy options='-c fencepost.token=1 -c fencepost.fence_key=psycopg'"

if [ "$ONLY" = both ] || [ "$ONLY" = direct ]; then
  run_suite direct "$DIRECT_DSN"
fi

if [ "$ONLY" = both ] || [ "$ONLY" = endpoint ] || [ "$ONLY" = serve ]; then
  log "starting the proxy (SQL endpoint :$EP_PORT, HTTP :$HTTP_PORT; log: $LOGS/proxy.log)"
  (
    cd "$BASE/fencepost"
    export DATABASE_URL="postgres://postgres:$SUPER_PW@127.0.0.1:$PG_PORT/fp_endpoint"
    export FENCEPOST_PGWIRE_PORT=$EP_PORT PORT=$HTTP_PORT HOST=127.0.0.1 FENCEPOST_LOG_LEVEL=${FENCEPOST_LOG_LEVEL:-warn}
    exec node bin/fencepost.js serve >"$LOGS/proxy.log" 2>&1
  ) &
  PROXY_PID=$!
  for _ in $(seq 1 120); do
    kill -0 "$PROXY_PID" 2>/dev/null || die "the proxy exited: see $LOGS/proxy.log"
    if (exec 3<>"/dev/tcp/127.0.0.1/$EP_PORT") 2>/dev/null \
      && [ "$(psql_su -d fp_endpoint -Atc "SELECT count(*) FROM pg_roles WHERE rolname = 'fencepost_client'")" = 1 ]; then
      break
    fi
    sleep 1
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$EP_PORT") 2>/dev/null || die "the SQL endpoint did not listen on $EP_PORT"
  psql_su -d fp_endpoint -c "$(grant_sql fp_endpoint fencepost_client)"
  # one fenced write through the endpoint before the suite: the fence psycopg is raised to token 1
  PGOPTIONS='-c fencepost.token=1 -c fencepost.fence_key=psycopg' \
    psql -X -q -v ON_ERROR_STOP=1 "host=127.0.0.1 port=$EP_PORT dbname=fp_endpoint user=psy" \
    -c 'CREATE TABLE smoke (id int)' -c 'DROP TABLE smoke' || die "a fenced write through the endpoint failed"
  if [ "$ONLY" = serve ]; then
    log "serving; direct DSN: $DIRECT_DSN"
    log "serving; endpoint DSN: $ENDPOINT_DSN"
    while kill -0 "$PROXY_PID" 2>/dev/null; do sleep 1; done
    exit 0
  fi
  run_suite endpoint "$ENDPOINT_DSN"
  # Timing-based tests (the pool's) flake on a busy machine: run each regression again, both ways
  # alternately, so the comparison can tell a consistent failure from noise.
  rm -f "$RESULTS"/rerun-*.jsonl
  if [ "$RERUNS" -gt 0 ] && [ -s "$RESULTS/direct.jsonl" ]; then
    mapfile -t regressed < <($PY "$TOOLS/compare.py" "$RESULTS/direct.jsonl" "$RESULTS/endpoint.jsonl" --list-regressions)
    if [ ${#regressed[@]} -gt 0 ]; then
      log "running the ${#regressed[@]} tests that failed only through the endpoint $RERUNS more times each way"
      for i in $(seq 1 "$RERUNS"); do
        run_suite "rerun-endpoint-$i" "$ENDPOINT_DSN" "${regressed[@]}"
        run_suite "rerun-direct-$i" "$DIRECT_DSN" "${regressed[@]}"
      done
    fi
  fi
fi

# ---------------------------------------------------------------- comparison
if [ -s "$RESULTS/direct.jsonl" ] && [ -s "$RESULTS/endpoint.jsonl" ]; then
  $PY "$TOOLS/compare.py" "$RESULTS/direct.jsonl" "$RESULTS/endpoint.jsonl" --reruns "$RESULTS" | tee "$RESULTS/comparison.txt"
  log "comparison written to $RESULTS/comparison.txt"
fi
