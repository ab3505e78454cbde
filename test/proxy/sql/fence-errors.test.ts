// What a writer can do after the fence refused the start of its transaction: the session stays
// usable. psycopg2 in its default (non-autocommit) mode sends BEGIN on its own before the first
// statement and believes no transaction is open when that BEGIN fails; the proxy rolls the block
// back when the fence after a lone BEGIN fails, so the backend agrees. A new leader sets its new
// token on a session whose token went stale: the SET runs without the fence (it writes nothing),
// and the next transaction is fenced with the new token.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { spawn } from 'node:child_process';
import pg from 'pg';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { RawClient, S, pbe } from './raw-client.ts';

const PYTHON = '/usr/bin/python3';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  // A short lock timeout, so a fence waiting for a locked fence row gives up (55P03) quickly.
  sql = await startSqlProxy(db, { FENCEPOST_LOCK_TIMEOUT_MS: '300' });
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO ${clientRoleFor(db.url)}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const ids = { next: 1 };
const id = () => ids.next++;
const present = async (...ns: number[]) =>
  (await db.pool.query<{ id: number }>('SELECT id FROM public.items WHERE id = ANY($1) ORDER BY id', [ns])).rows.map((r) => r.id);
const raise = async (fenceKey: string, token: number) => {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token) },
  });
  expect(res.status).toBe(200);
};

/** Runs a psycopg2 program (argv[1]: the endpoint's URL); `onLine` sees each line it prints and may answer on its stdin. */
function python(program: string, user: string, onLine: (line: string, answer: () => void) => void = () => {}): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ['-u', '-c', program, sql.url(user)], { stdio: ['pipe', 'pipe', 'pipe'] });
    const lines: string[] = [];
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      for (let nl = out.indexOf('\n'); nl >= 0; nl = out.indexOf('\n')) {
        const line = out.slice(0, nl);
        out = out.slice(nl + 1);
        lines.push(line);
        onLine(line, () => child.stdin.write('\n'));
      }
    });
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(lines) : reject(new Error(`python exited ${code}: ${err}`))));
  });
}

describe('psycopg2 in its default mode, after a fence error at the start of a transaction', () => {
  // Invariant: after conn.rollback() the session is idle again (never 25P02 for ever), and a write
  // commits only once the session holds a current token.
  test('FP409 (stale token): rollback, the next transaction meets the fence again, then SET fencepost.token to the new one and the write commits', async () => {
    await raise('py/stale', 6);
    const [x, y, z] = [id(), id(), id()];
    const program = `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(5, 'py/stale')}')
cur = conn.cursor()
for n in (${x}, ${y}):
    try:
        cur.execute("INSERT INTO items VALUES (%s, 'stale')", (n,))
        conn.commit()
        print('committed')
    except psycopg2.Error as e:
        print(e.pgcode)
        conn.rollback()
conn.autocommit = True
cur.execute("SET fencepost.token = '7'")
conn.autocommit = False
cur.execute("INSERT INTO items VALUES (%s, 'new leader')", (${z},))
conn.commit()
cur.execute("SHOW fencepost.token")
print(cur.fetchone()[0])
conn.commit()
`;
    expect(await python(program, 'py-stale')).toEqual(['FP409', 'FP409', '7']);
    expect(await present(x, y, z)).toEqual([z]);
    expect(await fenceRow(db.pool, 'py/stale')).toEqual({ highest_token: '7' });
  });

  test('psycopg2 and psycopg 3 in their default mode (BEGIN first): after FP409, SET fencepost.token to the new one, commit, and the next write commits', async () => {
    // Invariant: the SET, sent inside the driver's own BEGIN, is not refused by the stale verdict;
    // the stale token's writes land nowhere; the new token's do.
    await raise('py/begin-first', 6);
    const [a, b, c, d] = [id(), id(), id(), id()];
    const program = `
import sys, psycopg2, psycopg
def run(conn, err, code, stale, fresh, token):
    cur = conn.cursor()
    try:
        cur.execute("INSERT INTO items VALUES (%s, 'stale')", (stale,))
        conn.commit()
        print('committed')
    except err as e:
        print(code(e))
        conn.rollback()
    cur.execute("SET fencepost.token = '%d'" % token)
    conn.commit()
    cur.execute("INSERT INTO items VALUES (%s, 'new leader')", (fresh,))
    conn.commit()
    print('ok')
run(psycopg2.connect(sys.argv[1], options='${fenceOptions(5, 'py/begin-first')}'), psycopg2.Error, lambda e: e.pgcode, ${a}, ${b}, 7)
run(psycopg.connect(sys.argv[1], options='${fenceOptions(5, 'py/begin-first')}'), psycopg.Error, lambda e: e.sqlstate, ${c}, ${d}, 8)
`;
    expect(await python(program, 'py-begin-first')).toEqual(['FP409', 'ok', 'FP409', 'ok']);
    expect(await present(a, b, c, d)).toEqual([b, d]);
    expect(await fenceRow(db.pool, 'py/begin-first')).toEqual({ highest_token: '8' });
  });

  test('the extended protocol, as pgJDBC sends SET (Parse/Bind/Execute/Sync): after FP409 the SET goes unfenced and the next write commits at the new token', async () => {
    await raise('jdbc/stale', 6);
    const [x, y] = [id(), id()];
    const raw = await RawClient.connect(sql.port, sql.database, 'jdbc-order', fenceOptions(5, 'jdbc/stale'));
    try {
      const stale = await raw.send([...pbe(`INSERT INTO items VALUES (${x}, 'stale')`), S()]);
      expect(stale.errors).toEqual(['FP409']);
      // In the same group as a write, the fence comes right after the SET, with the verdict as it
      // stands (stale): the group fails and its SET rolls back with it.
      const sameGroup = await raw.send([...pbe("SET fencepost.token = '7'"), ...pbe(`INSERT INTO items VALUES (${x}, 'same group')`), S()]);
      expect(sameGroup.errors).toEqual(['FP409']);
      const set = await raw.send([...pbe("SET fencepost.token = '7'"), S()]);
      expect([set.errors, set.tags]).toEqual([[], ['SET']]);
      const fresh = await raw.send([...pbe(`INSERT INTO items VALUES (${y}, 'new leader')`), S()]);
      expect([fresh.errors, fresh.tags]).toEqual([[], ['INSERT 0 1']]);
    } finally {
      raw.close();
    }
    expect(await present(x, y)).toEqual([y]);
    expect(await fenceRow(db.pool, 'jdbc/stale')).toEqual({ highest_token: '7' });
  });

  test('55P03 (the fence row is locked): rollback, and once the lock is gone the same session writes', async () => {
    await raise('py/lock', 6);
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query("SELECT 1 FROM fencepost.fences WHERE fence_key = 'py/lock' FOR UPDATE");
    const [x, y] = [id(), id()];
    const program = `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(6, 'py/lock')}')
cur = conn.cursor()
try:
    cur.execute("INSERT INTO items VALUES (%s, 'locked out')", (${x},))
    conn.commit()
    print('committed')
except psycopg2.Error as e:
    print(e.pgcode)
    conn.rollback()
sys.stdin.readline()
cur.execute("INSERT INTO items VALUES (%s, 'after the lock')", (${y},))
conn.commit()
print('committed')
`;
    const lines = await python(program, 'py-lock', (line, answer) => {
      if (line === '55P03') void holder.query('COMMIT').then(answer);
    });
    await holder.end();
    expect(lines).toEqual(['55P03', 'committed']);
    expect(await present(x, y)).toEqual([y]);
  });
});

describe('SET fencepost.token on a session whose token went stale', () => {
  // Invariant: the SET itself runs without the fence (it writes nothing); every transaction after
  // it is fenced with the new token, and the session's transactions stay read-only by default.
  test('a session at 5 behind a fence at 6 sets token 7: its next write commits at 7', async () => {
    await raise('set/stale', 6);
    const c = await sql.connect('set-stale', { options: fenceOptions(5, 'set/stale') });
    const [x, y] = [id(), id()];
    await expect(c.query(`INSERT INTO items VALUES (${x}, 'stale')`)).rejects.toMatchObject({ code: 'FP409' });
    await c.query("SET fencepost.token = '7'");
    await c.query(`INSERT INTO items VALUES (${y}, 'at 7')`);
    expect(await present(x, y)).toEqual([y]);
    expect(await fenceRow(db.pool, 'set/stale')).toEqual({ highest_token: '7' });
    await c.end();
  });

  test('SET and RESET of fencepost.fence_key and fencepost.token go through unfenced; a stale token still writes nothing', async () => {
    await raise('set/stale-key', 6);
    const c = await sql.connect('set-key', { options: fenceOptions(5, 'set/stale-key') });
    await c.query("SET fencepost.fence_key = 'set/other'");
    await c.query('RESET fencepost.fence_key');
    await c.query("SET SESSION fencepost.token TO '4'");
    await c.query('RESET fencepost.token'); // back to the startup options' 5
    const x = id();
    await expect(c.query(`INSERT INTO items VALUES (${x}, 'stale')`)).rejects.toMatchObject({ code: 'FP409' });
    expect(await present(x)).toEqual([]);
    expect(await fenceRow(db.pool, 'set/stale-key')).toEqual({ highest_token: '6' });
    await c.end();
  });

  test('on a session without a fence, an unfenced SET fencepost.token puts the read-only default back first', async () => {
    // (A fenced session's default is the writer's: test/proxy/sql/transaction-modes.test.ts.)
    const c = await sql.connect('set-default');
    await c.query('SET default_transaction_read_only = off');
    await c.query("SET fencepost.fence_key = 'set/default'");
    expect((await c.query('SHOW default_transaction_read_only')).rows).toEqual([{ default_transaction_read_only: 'on' }]);
    await c.end();
  });
});
