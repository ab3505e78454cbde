# A replica's writer under `fencepost elect --proxy --fence-key`, with psycopg2 through the proxy's
# SQL endpoint: it loops BEGIN; INSERT; COMMIT with its term's token and fence key as startup
# options. When the file WRITER_HOLD exists after an INSERT, the writer that claims it (renames it
# away: one writer, once) logs `holding` and waits for SIGCONT before its COMMIT, so a freeze lands
# between INSERT and COMMIT every time. Events go to WRITER_LOG as JSON lines. A failed COMMIT is
# logged with its SQLSTATE and ends the writer (exit 3): it has been deposed.
#
# env: FENCING_TOKEN, FENCE_KEY, ELECTION_ID (from elect), WRITER_PGWIRE (host:port/database),
#      WRITER_TABLE, WRITER_LOG, WRITER_HOLD, WRITER_INTERVAL_MS (default 100)
import json, os, signal, sys, time
import psycopg2

token, fence_key, me = os.environ['FENCING_TOKEN'], os.environ['FENCE_KEY'], os.environ['ELECTION_ID']
hostport, dbname = os.environ['WRITER_PGWIRE'].split('/', 1)
host, port = hostport.rsplit(':', 1)
table, log_path, hold = os.environ['WRITER_TABLE'], os.environ['WRITER_LOG'], os.environ['WRITER_HOLD']
interval = int(os.environ.get('WRITER_INTERVAL_MS', '100')) / 1000


def log(event, **kw):
    with open(log_path, 'a') as f:
        f.write(json.dumps({'t': time.time() * 1000, 'replica': me, 'token': token, 'pid': os.getpid(), 'event': event, **kw}) + '\n')


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})  # taken with sigwait when holding
conn = psycopg2.connect(host=host, port=port, dbname=dbname, user=me, options=f'-c fencepost.token={token} -c fencepost.fence_key={fence_key}')
conn.autocommit = True  # the transaction is the writer's own: BEGIN … COMMIT below
cur = conn.cursor()
log('started')
seq = 0
while True:
    seq += 1
    key = f'{me}-t{token}-{seq}'
    cur.execute('BEGIN')
    cur.execute(f'INSERT INTO {table} (key, token) VALUES (%s, %s)', (key, int(token)))
    try:
        os.rename(hold, hold + '.taken')
        log('holding', key=key)
        signal.sigwait({signal.SIGCONT})
    except FileNotFoundError:
        pass
    try:
        cur.execute('COMMIT')
    except psycopg2.Error as e:
        log('commit-failed', key=key, code=e.pgcode, message=str(e).strip())
        sys.exit(3)
    log('committed', key=key)
    time.sleep(interval)
