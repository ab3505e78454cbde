// Cancel requests on the SQL endpoint are forwarded before their connection is closed: a driver
// (libpq's PQcancel, node-postgres, pgJDBC) takes the close as "the server has the cancel" and goes
// on, so a cancel still on its way would hit the writer's next statement instead.
// Postgres sits behind a TCP proxy here that can hold new connections silent (blackhole), which
// holds the endpoint's cancel connection to Postgres for as long as the test likes.
import { connect as tcp } from 'node:net';
import { describe, expect } from 'vitest';
import type pg from 'pg';
import { TcpProxy } from '../../../tools/faults/tcp-proxy.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { cancelPacket, fenceOptions, fenceRow } from '../../support/sql.ts';

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
  .extend('clientTables', { scope: 'file' }, [{ definition: 'public.cancelled (id int PRIMARY KEY)', privileges: 'SELECT, INSERT' }]);

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

describe('a cancel and the BEGIN the proxy answered', () => {
  // The proxy answers a lone BEGIN itself and sends it later, in front of the writer's next Query
  // (planner.ts). A cancel's signal can reach the backend after Postgres closed the cancel
  // connection, even a statement later, and fail that BEGIN: what runs then must still carry the
  // proof. Before, the proof went with the BEGIN in a Query of its own, and the writer's Query
  // behind it ran unfenced (2 rows of 400 landed in a run like this one).
  test('a stale writer that sends a cancel right behind each INSERT after its BEGIN writes nothing (400 tries)', async ({ db, sql }) => {
    // Invariant: no row of a stale session's lands, however its cancels fall; the fence stays.
    // A late cancel may fail the writer's next statement (its ROLLBACK, tried again), or the
    // BEGIN the proxy sends for it (the block the writer was told of is gone: the session ends).
    const key = 'cancel/stale';
    const connect = () => sql.connect('cancel-stale', { options: fenceOptions(1, key) });
    let old = await connect();
    await old.query('INSERT INTO cancelled VALUES (100)');
    const neu = await sql.connect('cancel-new', { options: fenceOptions(2, key) });
    await neu.query('INSERT INTO cancelled VALUES (101)');
    await neu.end();
    for (let i = 0; i < 400; i++) {
      try {
        await old.query('BEGIN');
        const insert = code(old.query(`INSERT INTO cancelled VALUES (${1000 + i})`));
        for (let k = 0; k < (i % 7) * 20000; k++); // the cancel a little later each time
        await cancel(sql.port, old).done;
        expect(['FP409', '57014']).toContain(await insert);
        while ((await code(old.query('ROLLBACK'))) === '57014');
      } catch (err) {
        if (!/connection|not queryable|terminated/i.test(String(err))) throw err;
        await old.end().catch(() => {});
        old = await connect();
      }
    }
    await old.end();
    expect((await db.pool.query('SELECT count(*)::int AS n FROM public.cancelled WHERE id >= 1000')).rows).toEqual([{ n: 0 }]);
    expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '2' });
  });
});
