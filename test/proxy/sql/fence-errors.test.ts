// What a writer meets when the fence refuses or ends its connection, and how it recovers. The
// connection is fenced once, at startup: a stale token, or a fence row that stays locked, is
// refused then (FATAL: the driver's connect fails), and a newer leader's raise ends a fenced
// connection (FP409 as its next answer; its open transaction's writes never land). The recovery
// is always a new connection with the current token. SET fencepost.token after startup does not
// fence the connection again: a protected table refuses its writes (FP400) until RESET or a
// reconnect.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { spawn } from 'node:child_process';
import pg from 'pg';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';
import { RawClient, S, pbe } from './raw-client.ts';

const PYTHON = '/usr/bin/python3';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  // A short lock timeout, so a fence waiting for a locked fence row gives up (55P03) quickly; a
  // short raise wait, so a raise ends an older token's open transaction soon.
  sql = await startSqlProxy(db, { FENCEPOST_LOCK_TIMEOUT_MS: '300', FENCEPOST_RAISE_WAIT_MS: '200' });
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

/** A table of its own, protected by `fenceKey`, that the client role may write (rows: id). */
async function guardedTable(name: string, fenceKey: string): Promise<() => Promise<number[]>> {
  await db.pool.query(`CREATE TABLE public.${name} (id int PRIMARY KEY)`);
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.${name} TO ${clientRoleFor(db.url)}`);
  await protectTable(db.pool, `public.${name}`, fenceKey);
  return async () => (await db.pool.query<{ id: number }>(`SELECT id FROM public.${name} ORDER BY id`)).rows.map((r) => r.id);
}

/** Python: the FATAL message of a connection error (libpq shows no SQLSTATE for a failed connection). */
const FATAL_OF = `
import re
def fatal(e):
    m = re.search(r'FATAL:\\s+(.*)', str(e))
    return m.group(1) if m else str(e)
`;

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

describe('a stale token is refused at connect; the writer recovers with a new connection at the new token', () => {
  // Invariant: a connection whose token is below the fence never gets a session (nothing it could
  // send lands); a new connection with the current leader's token writes.
  test('psycopg2 and psycopg 3 in their default mode (BEGIN first): connect fails with "stale fencing token", a new connection at the new token commits', async () => {
    await raise('py/stale', 6);
    const [x, y] = [id(), id()];
    const program = `${FATAL_OF}
import sys, psycopg2, psycopg
def run(mod, stale, fresh, n):
    try:
        mod.connect(sys.argv[1], options=stale)
        print('connected')
    except mod.OperationalError as e:
        print(fatal(e))
    conn = mod.connect(sys.argv[1], options=fresh)
    cur = conn.cursor()
    cur.execute("INSERT INTO items VALUES (%s, 'new leader')", (n,))
    conn.commit()
    print('committed')
    conn.close()
run(psycopg2, '${fenceOptions(5, 'py/stale')}', '${fenceOptions(7, 'py/stale')}', ${x})
run(psycopg, '${fenceOptions(5, 'py/stale')}', '${fenceOptions(8, 'py/stale')}', ${y})
`;
    expect(await python(program, 'py-stale')).toEqual([
      'stale fencing token: token 5 is below the highest token 6 of fence key "py/stale"',
      'committed',
      'stale fencing token: token 5 is below the highest token 7 of fence key "py/stale"',
      'committed',
    ]);
    expect(await present(x, y)).toEqual([x, y]);
    expect(await fenceRow(db.pool, 'py/stale')).toEqual({ highest_token: '8' });
  });

  test('the extended protocol, as pgJDBC writes: the stale startup is refused FP409, a new connection at the new token writes with Parse/Bind/Execute/Sync', async () => {
    await raise('jdbc/stale', 6);
    const x = id();
    await expect(RawClient.connect(sql.port, sql.database, 'jdbc-stale', fenceOptions(5, 'jdbc/stale'))).rejects.toThrow(
      'startup failed: FP409',
    );
    const raw = await RawClient.connect(sql.port, sql.database, 'jdbc-fresh', fenceOptions(7, 'jdbc/stale'));
    try {
      const fresh = await raw.send([...pbe(`INSERT INTO items VALUES (${x}, 'new leader')`), S()]);
      expect([fresh.errors, fresh.tags]).toEqual([[], ['INSERT 0 1']]);
    } finally {
      raw.close();
    }
    expect(await present(x)).toEqual([x]);
    expect(await fenceRow(db.pool, 'jdbc/stale')).toEqual({ highest_token: '7' });
  });

  test('55P03 (the fence row is locked): the connect fails, and once the lock is gone a new connection at the same token writes', async () => {
    await raise('py/lock', 6);
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query("SELECT 1 FROM fencepost.fences WHERE fence_key = 'py/lock' FOR UPDATE");
    const x = id();
    const program = `${FATAL_OF}
import sys, psycopg2
try:
    psycopg2.connect(sys.argv[1], options='${fenceOptions(6, 'py/lock')}')
    print('connected')
except psycopg2.OperationalError as e:
    print(fatal(e))
sys.stdin.readline()
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(6, 'py/lock')}')
cur = conn.cursor()
cur.execute("INSERT INTO items VALUES (%s, 'after the lock')", (${x},))
conn.commit()
print('committed')
`;
    const lines = await python(program, 'py-lock', (line, answer) => {
      if (line.startsWith('could not fence')) void holder.query('COMMIT').then(answer);
    });
    await holder.end();
    expect(lines).toEqual([
      'could not fence this connection at token 6 of fence key "py/lock": canceling statement due to lock timeout',
      'committed',
    ]);
    expect(await present(x)).toEqual([x]);
  });

  test('node-postgres: connect() rejects with FP409 and the stale detail; the rejection is recorded for the SQL door', async () => {
    await raise('pg/stale', 6);
    await expect(sql.connect('pg-stale', { options: fenceOptions(5, 'pg/stale') })).rejects.toMatchObject({
      code: 'FP409',
      severity: 'FATAL',
      message: 'stale fencing token: token 5 is below the highest token 6 of fence key "pg/stale"',
      detail: 'fence key "pg/stale", token 5, highest token 6',
    });
    await expect
      .poll(async () => {
        const res = await fetch(`${sql.proxy.url}/v1/rejections?fenceKey=${encodeURIComponent('pg/stale')}`);
        return ((await res.json()) as { rejections: unknown[] }).rejections;
      })
      .toEqual([expect.objectContaining({ door: 'sql', operation: 'transaction', token: '5', highestToken: '6', writerId: 'pg-stale' })]);
  });
});

describe("a newer leader's raise ends a fenced connection", () => {
  // Invariant: once the raise commits, the older token's connection is gone; what its open
  // transaction wrote never lands; a new connection at the new token writes.
  test('psycopg2 with a transaction open at 6: a raise to 7 ends it (FP409 at its commit), nothing of it lands, a new connection at 7 commits', async () => {
    await raise('py/raised', 6);
    const [x, y] = [id(), id()];
    const program = `
import sys, psycopg2
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(6, 'py/raised')}')
cur = conn.cursor()
cur.execute("INSERT INTO items VALUES (%s, 'old leader')", (${x},))
print('open')
sys.stdin.readline()
try:
    conn.commit()
    print('committed')
except psycopg2.Error as e:
    print(e.pgcode, str(e).splitlines()[0])
conn = psycopg2.connect(sys.argv[1], options='${fenceOptions(7, 'py/raised')}')
cur = conn.cursor()
cur.execute("INSERT INTO items VALUES (%s, 'new leader')", (${y},))
conn.commit()
print('committed')
`;
    let raised: Promise<void> = Promise.resolve();
    const lines = await python(program, 'py-raised', (line, answer) => {
      if (line === 'open') (raised = raise('py/raised', 7)).then(answer, answer);
    });
    await raised;
    expect(lines).toEqual([
      'open',
      'FP409 stale fencing token: a newer leader raised fence key "py/raised" to token 7, above this connection\'s token 6',
      'committed',
    ]);
    expect(await present(x, y)).toEqual([y]);
  });
});

describe('SET fencepost.token or fencepost.fence_key after startup does not fence the connection again', () => {
  // Invariant: a connection stays fenced at its startup pair; while its settings differ from that
  // pair, protected tables refuse its writes (FP400) and the fence is not raised.
  test('fenced at 6, SET fencepost.token to 7: SHOW shows 7, a protected write is refused FP400, the fence stays at 6; a new connection at 7 writes', async () => {
    const guarded = await guardedTable('set_token', 'set/token');
    await raise('set/token', 6);
    const c = await sql.connect('set-token', { options: fenceOptions(6, 'set/token') });
    const [x, y, z] = [id(), id(), id()];
    await c.query("SET fencepost.token = '7'");
    expect((await c.query('SHOW fencepost.token')).rows).toEqual([{ 'fencepost.token': '7' }]);
    await expect(c.query(`INSERT INTO set_token VALUES (${x})`)).rejects.toMatchObject({
      code: 'FP400',
      message: expect.stringContaining('was changed after this connection was fenced'),
      hint: expect.stringContaining('reconnect with the new token'),
    });
    // An unprotected table is written as the startup pair.
    await c.query(`INSERT INTO items VALUES (${z}, 'startup pair')`);
    await c.end();
    expect(await fenceRow(db.pool, 'set/token')).toEqual({ highest_token: '6' });
    const fresh = await sql.connect('set-token', { options: fenceOptions(7, 'set/token') });
    await fresh.query(`INSERT INTO set_token VALUES (${y})`);
    await fresh.end();
    expect(await guarded()).toEqual([y]);
    expect(await present(z)).toEqual([z]);
    expect(await fenceRow(db.pool, 'set/token')).toEqual({ highest_token: '7' });
  });

  test('SET fencepost.fence_key or fencepost.token, then RESET: refused FP400 while changed, written again once RESET', async () => {
    const guarded = await guardedTable('set_reset', 'set/reset');
    await raise('set/reset', 6);
    const c = await sql.connect('set-reset', { options: fenceOptions(6, 'set/reset') });
    const [a, b, x] = [id(), id(), id()];
    await c.query("SET fencepost.fence_key = 'set/other'");
    await expect(c.query(`INSERT INTO set_reset VALUES (${a})`)).rejects.toMatchObject({ code: 'FP400' });
    await c.query('RESET fencepost.fence_key');
    await c.query("SET SESSION fencepost.token TO '4'");
    await expect(c.query(`INSERT INTO set_reset VALUES (${b})`)).rejects.toMatchObject({ code: 'FP400' });
    await c.query('RESET fencepost.token'); // back to the startup options' 6
    await c.query(`INSERT INTO set_reset VALUES (${x})`);
    await c.end();
    expect(await guarded()).toEqual([x]);
    expect(await fenceRow(db.pool, 'set/reset')).toEqual({ highest_token: '6' });
    expect(await fenceRow(db.pool, 'set/other')).toBeUndefined();
  });

  test('a tokenless session that SETs fencepost.token and fencepost.fence_key is not fenced: a protected write is refused FP403, no fence is raised', async () => {
    const guarded = await guardedTable('set_tokenless', 'set/tokenless');
    const c = await sql.connect('set-tokenless');
    await c.query("SET fencepost.fence_key = 'set/tokenless'");
    await c.query("SET fencepost.token = '3'");
    await c.query('SET default_transaction_read_only = off');
    await expect(c.query(`INSERT INTO set_tokenless VALUES (${id()})`)).rejects.toMatchObject({ code: 'FP403' });
    await c.end();
    expect(await guarded()).toEqual([]);
    expect(await fenceRow(db.pool, 'set/tokenless')).toBeUndefined();
  });
});
