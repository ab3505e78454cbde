// Cancel requests on the SQL endpoint are forwarded before their connection is closed: a driver
// (libpq's PQcancel, node-postgres, pgJDBC) takes the close as "the server has the cancel" and goes
// on, so a cancel still on its way would hit the writer's next statement instead.
// Postgres sits behind a TCP proxy here that can hold new connections silent (blackhole), which
// holds the endpoint's cancel connection to Postgres for as long as the test likes. The proxy sends
// nothing of its own into a session after startup, so a cancel can only ever fail the writer's own
// statements: it cannot take a connection's fence away.
import { connect as tcp } from 'node:net';
import { describe, expect } from 'vitest';
import type pg from 'pg';
import { TcpProxy } from '../../../tools/faults/tcp-proxy.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { cancelPacket, fenceOptions, fenceRow } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';

const test = sqlTest
  .extend('tcp', { scope: 'file' }, async ({ db }, { onCleanup }): Promise<TcpProxy> => {
    const u = new URL(db.url);
    const proxy = await TcpProxy.start({ targetHost: u.hostname, targetPort: Number(u.port) });
    onCleanup(() => proxy.close());
    return proxy;
  })
  .extend('sqlEnv', { scope: 'file' }, async ({ db, tcp: proxy }) => {
    const u = new URL(db.url);
    u.port = String(proxy.port);
    return { DATABASE_URL: u.toString() };
  })
  .extend('clientTables', { scope: 'file' }, [
    { definition: 'public.cancelled (id int PRIMARY KEY)', privileges: 'SELECT, INSERT' },
    { definition: 'public.guarded (id int PRIMARY KEY)', privileges: 'SELECT, INSERT' },
  ]);

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string; message?: string }) => e.code ?? e.message ?? String(e),
  );

/** A CancelRequest for a node-postgres client's session; resolves when the endpoint closes its connection. */
function cancel(port: number, client: pg.Client): { closed: () => boolean; done: Promise<void> } {
  let closed = false;
  const s = tcp({ host: '127.0.0.1', port });
  s.on('error', () => {});
  const done = new Promise<void>((r) => s.once('close', () => ((closed = true), r())));
  s.write(cancelPacket(client)); // and wait: the endpoint closes
  return { closed: () => closed, done };
}

describe('cancel requests', () => {
  test('the endpoint closes the cancel connection only once Postgres has the cancel; the statement fails 57014 and the next one runs', async ({
    db,
    sql,
    tcp: proxy,
  }) => {
    // Invariant: when the endpoint closes a cancel connection, Postgres has closed its own (it has
    // signalled the backend), so the statement cancelled is the one running when the writer asked.
    const c = await sql.connect('canceller');
    const sleeping = code(c.query('SELECT pg_sleep(30)'));
    await expect
      .poll(
        async () =>
          (await db.pool.query(`SELECT 1 FROM pg_stat_activity WHERE query LIKE '%SELECT pg_sleep(30)' AND state = 'active'`)).rowCount,
        { interval: 20 },
      )
      .toBe(1);
    proxy.blackhole(); // the endpoint's cancel connection to Postgres is accepted and held silent
    const req = cancel(sql.port, c);
    await new Promise((r) => setTimeout(r, 500));
    expect(req.closed()).toBe(false);
    proxy.forward();
    await req.done;
    expect(await sleeping).toBe('57014');
    expect((await c.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await c.end();
  });

  test("BackendKeyData names the backend's own pid: pg_backend_pid() and a NOTIFY's pid agree with it, and a cancel by it reaches that backend", async ({
    sql,
  }) => {
    // Invariant: the pid a driver learns at startup is the one Postgres reports everywhere.
    const c = await sql.connect('pid-writer');
    const listener = await sql.connect('pid-listener');
    const { processID } = c as unknown as { processID: number };
    expect((await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid).toBe(processID);
    await listener.query('LISTEN fp_pid');
    const heard = new Promise<number>((r) => listener.once('notification', (n) => r(n.processId)));
    await c.query("NOTIFY fp_pid, 'hello'");
    expect(await heard).toBe(processID);
    await listener.end();
    await c.end();
  });
});

describe('cancels on a fenced connection', () => {
  test("a writer that sends a cancel right behind each INSERT in its block (100 tries): exactly its acknowledged commits land, it stays fenced, and a newer leader's raise still ends it", async ({
    db,
    sql,
  }) => {
    // Invariant: a cancel fails only the writer's own statements, wherever it falls: what lands in
    // the protected table is exactly what the writer saw commit; the connection is still fenced
    // after (a protected write goes through), and a raise above its token ends it with FP409.
    const key = 'cancel/fenced';
    await protectTable(db.pool, 'public.guarded', key);
    const old = await sql.connect('cancel-fenced', { options: fenceOptions(1, key) });
    const acknowledged: number[] = [];
    for (let i = 0; i < 100; i++) {
      const n = 1000 + i;
      // A late cancel of the previous round may fail the BEGIN: the INSERT then runs on its own.
      await code(old.query('BEGIN'));
      const insert = code(old.query(`INSERT INTO guarded VALUES (${n})`));
      for (let k = 0; k < (i % 7) * 20000; k++); // the cancel a little later each time
      await cancel(sql.port, old).done;
      const inserted = await insert;
      expect(['ok', '57014']).toContain(inserted);
      let end: string;
      do {
        end = await old.query('COMMIT').then(
          (r) => r.command,
          (e: { code?: string }) => e.code ?? String(e),
        );
      } while (end === '57014');
      if (inserted === 'ok' && end === 'COMMIT') acknowledged.push(n);
    }
    const landed = async () => (await db.pool.query<{ id: number }>('SELECT id FROM public.guarded ORDER BY id')).rows.map((r) => r.id);
    expect(await landed()).toEqual(acknowledged);
    await old.query('INSERT INTO guarded VALUES (1)'); // still fenced
    const ended = new Promise<unknown>((resolve) => old.once('error', resolve));
    const neu = await sql.connect('cancel-new', { options: fenceOptions(2, key) });
    await neu.query('INSERT INTO guarded VALUES (2)');
    await neu.end();
    const answer = await Promise.race([ended, code(old.query('INSERT INTO guarded VALUES (3)'))]);
    expect(answer === 'FP409' || (answer as { code?: string }).code === 'FP409').toBe(true);
    await old.end().catch(() => {});
    expect(await landed()).toEqual([1, 2, ...acknowledged]);
    expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '2' });
  });
});
