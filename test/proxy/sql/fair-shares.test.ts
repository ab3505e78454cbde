// Fair shares of the SQL endpoint: connections still in startup are capped per address
// (FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS), sessions per key (FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY,
// half of FENCEPOST_PGWIRE_MAX_CONNECTIONS by default with several keys), and idle unauthenticated
// connections never count against the sessions. Invariant: one address or one key at its limit
// never keeps another out, and each refusal names the setting.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { connect, Socket } from 'node:net';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, type SqlProxy } from '../../support/sql.ts';
import { uniqueRole } from '../../support/keys.ts';

let db: TestDatabase;
let sql: SqlProxy;
const role = uniqueRole('fair');
const idle: Socket[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
  const keys = JSON.stringify([
    { name: 'flood', secret: 'flood-secret-0123456789', fenceKeyPrefixes: ['f/'], pgRole: role },
    { name: 'calm', secret: 'calm-secret-0123456789', fenceKeyPrefixes: ['c/'], pgRole: role },
  ]);
  sql = await startSqlProxy(db, {
    FENCEPOST_KEYS: keys,
    FENCEPOST_READ_ACCESS: 'key',
    FENCEPOST_PGWIRE_MAX_CONNECTIONS: '6',
    FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS: '4',
  });
});

afterAll(async () => {
  for (const s of idle) s.destroy();
  await sql?.close();
  await db?.pool.query(`DROP OWNED BY ${role}`).catch(() => {});
  await db?.drop();
});

/** A socket node-postgres connects from `localAddress` (any of 127/8 reaches the loopback). */
class FromAddress extends Socket {
  constructor(private readonly from: string) {
    super();
  }
  override connect(...args: unknown[]): this {
    const [port, host] = args as [number, string];
    return super.connect({ port, host, localAddress: this.from });
  }
}

const client = (user: string, password: string, localAddress?: string) => {
  const c = new pg.Client({
    host: '127.0.0.1',
    port: sql.port,
    database: sql.database,
    user,
    password,
    ...(localAddress ? { stream: () => new FromAddress(localAddress) } : {}),
  });
  c.on('error', () => {});
  return c;
};
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: pg.DatabaseError) => ({ code: e.code, message: e.message }),
  );

test("connections that never say anything cannot keep a writer out: past the address's share, a new one closes the oldest silent one, which hears why", async () => {
  const heard: string[] = [];
  for (let i = 0; i < 4; i++) {
    const s = connect({ host: '127.0.0.1', port: sql.port, localAddress: '127.0.0.1' });
    s.on('error', () => {});
    s.on('data', (d: Buffer) => heard.push(d.toString('latin1')));
    idle.push(s);
  }
  await Promise.all(idle.map((s) => new Promise((resolve) => s.once('connect', resolve))));
  await new Promise((resolve) => setTimeout(resolve, 1200)); // silent long enough to be closed for a newcomer
  await expect
    .poll(
      async () => {
        const c = client('calm', 'calm-secret-0123456789', '127.0.0.1');
        const r = await refusal(c.connect());
        if (r === null) await c.end();
        return r;
      },
      { timeout: 10_000, interval: 200 },
    )
    .toBeNull();
  await expect.poll(() => heard.join('')).toContain('FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS=4');
  for (const s of idle.splice(0)) s.destroy();
});

test('a burst of logins from one address, more than its share of silent connections, all get in', async () => {
  // Five at once against a share of four: each speaks at once, so none is closed for silence.
  const clients = [
    ...Array.from({ length: 3 }, () => client('calm', 'calm-secret-0123456789')),
    ...Array.from({ length: 2 }, () => client('flood', 'flood-secret-0123456789')),
  ];
  const results = await Promise.all(
    clients.map(async (c) => {
      await c.connect();
      const one = (await c.query('SELECT 1 AS one')).rows[0].one as number;
      return one;
    }),
  );
  expect(results).toEqual([1, 1, 1, 1, 1]);
  for (const c of clients) await c.end();
});
