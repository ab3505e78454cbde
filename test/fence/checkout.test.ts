// withClient and hearClientErrors (src/fence/checkout.ts) on real Postgres. Invariant: a connection
// lost while checked out, idle or mid-query, or in the very read that completes its startup, is
// reported to the work (a rejected query), never as an unheard 'error' event that ends the process,
// and never goes back to the pool; a healthy checkout is pooled again.
import { createServer, connect as tcp, type Server } from 'node:net';
import { listenFree } from '../../tools/ports.ts';
import { afterAll, beforeAll, expect, test } from 'vitest';
import pg from 'pg';
import { hearClientErrors, withClient } from '../../src/fence/checkout.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';

let db: TestDatabase;
let pool: pg.Pool;

beforeAll(async () => {
  db = await createTestDatabase({ migrate: false });
  pool = new pg.Pool({ connectionString: db.url, max: 4 });
  pool.on('error', () => {});
});

afterAll(async () => {
  await pool?.end();
  await db?.drop();
});

const pidOf = (c: pg.PoolClient) => (c as unknown as { processID: number }).processID;

async function terminate(pid: number): Promise<void> {
  await db.pool.query('SELECT pg_terminate_backend($1)', [pid]);
}

test('a backend ended while its client is checked out and idle: the work hears it, the process lives, the client is dropped', async () => {
  let pid = 0;
  const outcome = await withClient(pool, async (client) => {
    pid = pidOf(client);
    const ended = new Promise<void>((resolve) => client.once('end', () => resolve()));
    await terminate(pid);
    await ended; // the 'error' event ('Connection terminated unexpectedly') came and went meanwhile
    return await client.query('SELECT 1').then(
      () => 'answered',
      (err: Error) => `rejected: ${err.message}`,
    );
  });
  expect(outcome).toMatch(/^rejected: /);
  // The next checkout is a new backend: the broken client was destroyed, not pooled.
  const next = await withClient(pool, async (client) => pidOf(client));
  expect(next).not.toBe(pid);
});

test('a backend ended mid-query: the work fails with the FATAL, and the client is not pooled again though its socket is still closing', async () => {
  let pid = 0;
  const failed = withClient(pool, async (client) => {
    pid = pidOf(client);
    // Its failure is taken at once: it may come before the terminate's own answer does.
    const running = client.query('SELECT pg_sleep(30)').then(
      () => null,
      (err: unknown) => err,
    );
    await waitFor(
      async () =>
        (await db.pool.query(`SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%'`, [pid])).rowCount === 1,
    );
    await terminate(pid);
    const err = await running;
    if (err !== null) throw err;
  });
  await expect(failed).rejects.toMatchObject({ code: '57P01', severity: 'FATAL' });
  expect(await pidsInPool()).not.toContain(pid);
});

test('a healthy checkout goes back to the pool; one the work discards does not', async () => {
  const kept = await withClient(pool, async (client) => pidOf(client));
  expect(await pidsInPool()).toContain(kept);
  const dropped = await withClient(pool, async (client, checkout) => {
    checkout.discard(new Error('a COMMIT still in flight'));
    return pidOf(client);
  });
  expect(await pidsInPool()).not.toContain(dropped);
  // A throwing work rethrows to the caller; the client, not discarded, is pooled.
  let thrownPid = 0;
  await expect(
    withClient(pool, async (client) => {
      thrownPid = pidOf(client);
      throw new Error('the work failed');
    }),
  ).rejects.toThrow('the work failed');
  expect(await pidsInPool()).toContain(thrownPid);
});

test('a backend ended right after startup, its FATAL in the same read as its first ReadyForQuery: the checkout hears it, the process lives', async () => {
  // A relay between the pool and Postgres that, once it has the backend's pid (BackendKeyData),
  // holds what Postgres sends next, ends the backend, and passes the ReadyForQuery and the FATAL
  // on in one write. pg-pool stops listening on a new client before the checkout's promise
  // settles: without hearClientErrors the FATAL is an 'error' event nobody hears.
  const target = new URL(db.url);
  const relay: Server = createServer((client) => {
    const server = tcp(Number(target.port), target.hostname);
    client.on('error', () => server.destroy());
    server.on('error', () => client.destroy());
    client.on('data', (b) => server.write(b));
    client.on('end', () => server.end());
    server.on('end', () => client.end());
    let seen = Buffer.alloc(0);
    let held: Buffer | null = null;
    server.on('data', (b: Buffer) => {
      if (held !== null) {
        held = Buffer.concat([held, b]);
        if (held.includes(Buffer.from('57P01'))) {
          client.write(held);
          held = Buffer.alloc(0);
        }
        return;
      }
      // Whole messages pass on as they come (authentication), up to and with BackendKeyData.
      seen = Buffer.concat([seen, b]);
      while (seen.length >= 5 && seen.length >= 1 + seen.readInt32BE(1)) {
        const end = 1 + seen.readInt32BE(1);
        client.write(seen.subarray(0, end));
        if (seen[0] === 0x4b /* K */) {
          held = seen.subarray(end);
          void terminate(seen.readInt32BE(5));
          return;
        }
        seen = seen.subarray(end);
      }
    });
  });
  const url = new URL(db.url);
  url.hostname = '127.0.0.1';
  url.port = String(await listenFree(relay));
  const relayed = hearClientErrors(new pg.Pool({ connectionString: url.toString(), max: 1 }));
  try {
    const outcome = await relayed.connect().then(
      async (client) => {
        client.on('error', () => {}); // the holder's own listener, as withClient attaches: too late for the FATAL
        const answer = await client.query('SELECT 1').then(
          () => 'answered',
          (err: Error) => `rejected: ${err.message}`,
        );
        client.release(true);
        return answer;
      },
      (err: Error) => `connect rejected: ${err.message}`,
    );
    expect(outcome).toMatch(/rejected: /);
  } finally {
    await relayed.end();
    await new Promise((resolve) => relay.close(resolve));
  }
});

/** The backends of the pool's idle clients, checked out all at once so each is seen. */
async function pidsInPool(): Promise<number[]> {
  const idle = (pool as unknown as { idleCount: number }).idleCount;
  const clients = await Promise.all(Array.from({ length: idle }, () => pool.connect()));
  for (const c of clients) c.on('error', () => {}); // heard, should one be ending: the assertion says it
  const pids = clients.map(pidOf);
  for (const c of clients) c.release();
  return pids;
}

async function waitFor(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not reached in 5 s');
}
