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
import { cancelPacket } from '../../support/sql.ts';

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
  });

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
