# The psycopg2 holder of bench/handover.ts: a writer at the old token inside BEGIN…COMMIT through the
# SQL endpoint. argv: the endpoint's libpq URL, the fence key, the token (PGOPTIONS carries the
# session's fencepost.token and fencepost.fence_key). It inserts its row (psycopg2 opens the
# transaction: BEGIN, then the INSERT, which fences it), says "ready", and waits for a line on
# stdin; the bench SIGSTOPs it meanwhile, raises the fence, SIGCONTs it and sends the line. Then it
# tries COMMIT and prints what it heard: "committed", or "error <SQLSTATE, or class: message>".
import sys

import psycopg2

url, fence_key, token = sys.argv[1], sys.argv[2], sys.argv[3]
conn = psycopg2.connect(url)
cur = conn.cursor()
cur.execute("INSERT INTO app.ho_rows (fence_key, token, who) VALUES (%s, %s, 'psycopg2')", (fence_key, int(token)))
print("ready", flush=True)
sys.stdin.readline()
try:
    conn.commit()
    print("committed", flush=True)
except psycopg2.Error as e:
    # libpq may give no SQLSTATE (a FATAL answer, then the connection closed): its first line then.
    first = str(e).strip().split("\n")[0]
    print("error", e.pgcode or f"{type(e).__name__}: {first}", flush=True)
try:
    conn.close()
except psycopg2.Error:
    pass
