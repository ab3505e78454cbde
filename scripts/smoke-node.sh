#!/usr/bin/env bash
# The built package on a second Node major (24; NODE_MAJOR=N for another), while npm test runs the
# whole suite on the machine's Node. About a minute:
#   - fencepost serve on the embedded Postgres with the SQL endpoint on: a write over HTTP and one
#     over the SQL endpoint with psql, then on each door a stale token is refused and nothing of it lands;
#   - fencepost elect: the leader's command runs with FENCING_TOKEN, and the fence at the proxy is
#     advanced to it;
#   - the forced-pause demo (`fencepost demo`): its writers run on that Node too.
# That Node comes from the npm registry (the package node-<platform>-<arch>@<major>, which holds
# bin/node) into ${XDG_CACHE_HOME:-~/.cache}/fencepost/node-<major>, fetched once.
# Needs what scripts/setup.sh --test installs (ZooKeeper and Java, psql).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[smoke]\033[0m %3ss %s\n' "$SECONDS" "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

major="${NODE_MAJOR:-24}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fencepost/node-$major"
if [ ! -x "$cache/bin/node" ]; then
  pkg="node-$(node -p 'process.platform + "-" + process.arch')@$major"
  say "fetching Node $major into $cache (npm pack $pkg)"
  download=$(mktemp -d)
  npm pack "$pkg" --pack-destination "$download" --silent >/dev/null
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache.part" && mkdir "$cache.part"
  tar xzf "$download"/*.tgz -C "$cache.part" --strip-components=1
  rm -rf "$download" "$cache" && mv "$cache.part" "$cache"
fi
node_bin="$cache/bin/node"
say "Node $("$node_bin" --version) ($node_bin)"

work=$(mktemp -d)
chmod 755 "$work" # as root, the embedded Postgres runs as the postgres user, who must reach its data folder
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# free_port: a port free now, of FENCEPOST_PORT_RANGE when set (dist/ports.js: run after npm run build).
free_port() {
  "$node_bin" --input-type=module -e 'import { freePort } from "./dist/ports.js"; console.log(await freePort());'
}

# http METHOD URL [BODY] [Header:value …]: prints the status and the body on one line ("000" when nothing answers).
http() {
  "$node_bin" --input-type=module -e '
const [method, url, body, ...headers] = process.argv.slice(1);
const init = { method, headers: Object.fromEntries(headers.map((h) => [h.slice(0, h.indexOf(":")), h.slice(h.indexOf(":") + 1)])) };
if (body) init.body = body;
const r = await fetch(url, init).catch(() => null);
console.log(r ? `${r.status} ${await r.text()}` : "000");' "$@"
}

# wait_for WHAT SECONDS COMMAND…: runs COMMAND every 0.2 s until it succeeds.
wait_for() {
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no $what within $seconds s"
    sleep 0.2
  done
}

# ZooKeeper, for elect and the demo (scripts/zookeeper.ts, run on this Node too).
"$node_bin" --import tsx scripts/zookeeper.ts >"$work/zk.out" 2>"$work/zk.err" &
zk_pid=$!
pids+=("$zk_pid")
zk_up() {
  kill -0 "$zk_pid" 2>/dev/null || fail "scripts/zookeeper.ts exited: $(cat "$work/zk.err")"
  grep -q '^ZK_CONNECT=' "$work/zk.out"
}
say "npm run build (dist/, which the fencepost command runs), while ZooKeeper starts"
npm run build --silent
wait_for ZooKeeper 60 zk_up
zk=$(sed -n 's/^ZK_CONNECT=//p' "$work/zk.out")
say "ZooKeeper at $zk"

# fencepost serve on the embedded Postgres, with the SQL endpoint.
http_port=$(free_port)
sql_port=$(free_port)
data="$work/serve/pgdata"
env -u DATABASE_URL FENCEPOST_DATA_DIR="$data" PORT="$http_port" FENCEPOST_PGWIRE_PORT="$sql_port" FENCEPOST_LOG_LEVEL=warn \
  "$node_bin" bin/fencepost.js serve 2>"$work/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
proxy="http://127.0.0.1:$http_port"
ready() {
  kill -0 "$serve_pid" 2>/dev/null || fail "fencepost serve exited: $(cat "$work/serve.err")"
  [[ $(http GET "$proxy/readyz") == 200* ]]
}
wait_for "ready proxy" 120 ready
say "fencepost serve: HTTP $proxy, SQL endpoint :$sql_port"

# HTTP: the leader (token 2) writes; a zombie (token 1) is refused with 409 stale_token and the object keeps the leader's body.
r=$(http PUT "$proxy/v1/objects/smoke%2Fhttp" leader Fencing-Token:2 Fence-Key:smoke-http)
[[ $r == 200* ]] || fail "HTTP write with token 2: $r"
r=$(http PUT "$proxy/v1/objects/smoke%2Fhttp" zombie Fencing-Token:1 Fence-Key:smoke-http)
[[ $r == 409*'"stale_token"'* ]] || fail "HTTP write with the stale token 1 was not refused with 409 stale_token: $r"
r=$(http GET "$proxy/v1/objects/smoke%2Fhttp")
[ "$r" = "200 leader" ] || fail "the object after the stale write: $r"
say "HTTP: token 2 wrote; stale token 1 refused (409 stale_token), the object unchanged"

# SQL endpoint, with psql: a table the client login may write, as the embedded superuser.
superuser=$(env -u DATABASE_URL FENCEPOST_DATA_DIR="$data" "$node_bin" bin/fencepost.js db-url) || fail "fencepost db-url beside serve failed"
psql -X -q -v ON_ERROR_STOP=1 "$superuser" \
  -c 'CREATE TABLE public.smoke (id int PRIMARY KEY, note text)' \
  -c 'GRANT SELECT, INSERT ON public.smoke TO fencepost_client' >/dev/null
sql_as() { # TOKEN STATEMENT
  PGOPTIONS="-c fencepost.token=$1 -c fencepost.fence_key=smoke-sql" \
    psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose "postgres://smoke-writer@127.0.0.1:$sql_port/postgres" -c "$2"
}
sql_as 3 "INSERT INTO public.smoke VALUES (1, 'leader')" >/dev/null 2>"$work/sql.err" || fail "SQL write with token 3: $(cat "$work/sql.err")"
sql_as 4 "INSERT INTO public.smoke VALUES (2, 'new leader')" >/dev/null 2>"$work/sql.err" || fail "SQL write with token 4: $(cat "$work/sql.err")"
status=0
sql_as 3 "INSERT INTO public.smoke VALUES (3, 'zombie')" >/dev/null 2>"$work/sql.err" || status=$?
# Refused at connect: libpq shows a refused connection's message, not its SQLSTATE.
[ "$status" != 0 ] && grep -q 'stale fencing token' "$work/sql.err" || fail "the stale token 3 was not refused (psql exit $status): $(cat "$work/sql.err")"
rows=$(psql -X -At "$superuser" -c 'SELECT string_agg(id::text, $$,$$ ORDER BY id) FROM public.smoke')
[ "$rows" = "1,2" ] || fail "rows after the stale SQL write: $rows (expected 1,2)"
say "SQL endpoint (psql): tokens 3 and 4 wrote; stale token 3 refused at connect (FP409), its row absent"

# fencepost elect: the leader's command runs with FENCING_TOKEN, after elect advanced the fence to it.
timeout 60 "$node_bin" bin/fencepost.js elect --zk "$zk" --path /fencepost-smoke/elect --id smoke-1 \
  --proxy "$proxy" --fence-key smoke-elect -- sh -c 'printf %s "$FENCING_TOKEN" > "$1"' sh "$work/elect.token" \
  2>"$work/elect.err" || fail "fencepost elect (exit $?): $(cat "$work/elect.err")"
token=$(cat "$work/elect.token" 2>/dev/null || true)
[[ $token =~ ^[0-9]+$ ]] || fail "the elected command saw FENCING_TOKEN='$token'"
r=$(http GET "$proxy/v1/fences/smoke-elect")
[[ $r == 200*"\"highestToken\":\"$token\""* ]] || fail "the fence smoke-elect after elect with token $token: $r"
say "fencepost elect: the command ran with FENCING_TOKEN=$token; the fence smoke-elect is at $token"

kill -TERM "$serve_pid"
status=0
wait "$serve_pid" || status=$?
[ "$status" = 0 ] || fail "fencepost serve exited $status on SIGTERM: $(cat "$work/serve.err")"
pids=("$zk_pid")
say "fencepost serve stopped on SIGTERM (exit 0)"

# The forced-pause demo: Postgres, the proxy and three writer processes, all on this Node.
say "the forced-pause demo (fencepost demo)"
env -u DATABASE_URL ZK_CONNECT="$zk" "$node_bin" bin/fencepost.js demo >"$work/demo.out" 2>&1 || { cat "$work/demo.out" >&2; fail "the demo"; }
tail -n 3 "$work/demo.out" >&2
say "passed on Node $("$node_bin" --version)"
