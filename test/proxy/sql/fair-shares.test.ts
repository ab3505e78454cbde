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
  sql = await startSqlProxy(db, { FENCEPOST_KEYS: keys, FENCEPOST_READ_ACCESS: 'key', FENCEPOST_PGWIRE_MAX_CONNECTIONS: '6', FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS: '4' });
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
  const c = new pg.Client({ host: '127.0.0.1', port: sql.port, database: sql.database, user, password, ...(localAddress ? { stream: () => new FromAddress(localAddress) } : {}) });
  c.on('error', () => {});
  return c;
};
const refusal = (p: Promise<unknown>) => p.then(() => null, (e: pg.DatabaseError) => ({ code: e.code, message: e.message }));

test('idle connections that never start fill their address\'s startup share only: another address, and a session already started, go on', async () => {
  for (let i = 0; i < 4; i++) {
    const s = connect({ host: '127.0.0.1', port: sql.port, localAddress: '127.0.0.1' });
    s.on('error', () => {});
    idle.push(s);
  }
  await Promise.all(idle.map((s) => new Promise((resolve) => s.once('connect', resolve))));
  // Refused once the listener has taken the four (a refusal is no startup left open: it ends at once).
  await expect
    .poll(async () => (await refusal(client('calm', 'calm-secret-0123456789', '127.0.0.1').connect()))?.message ?? 'connected')
    .toContain('FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS=4');
  const elsewhere = client('calm', 'calm-secret-0123456789', '127.0.0.2');
  await elsewhere.connect();
  expect((await elsewhere.query('SELECT 1 AS one')).rows[0].one).toBe(1);
  await elsewhere.end();
  for (const s of idle.splice(0)) s.destroy();
  // Their share comes back once the listener sees them go.
  await expect
    .poll(async () => {
      const c = client('calm', 'calm-secret-0123456789', '127.0.0.1');
      const r = await refusal(c.connect());
      if (r === null) await c.end();
      return r;
    })
    .toBeNull();
});

test('a key at its share of sessions is refused naming the setting; another key still gets in', async () => {
  const held: pg.Client[] = [];
  // Six sessions in all, two keys: each key may hold three.
  for (let i = 0; i < 3; i++) {
    const c = client('flood', 'flood-secret-0123456789');
    await c.connect();
    held.push(c);
  }
  const fourth = await refusal(client('flood', 'flood-secret-0123456789').connect());
  expect(fourth).toMatchObject({ code: '53300', message: expect.stringContaining('FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY=3') });
  const calm = client('calm', 'calm-secret-0123456789');
  await calm.connect();
  expect((await calm.query('SELECT 1 AS one')).rows[0].one).toBe(1);
  await calm.end();
  // A session that ends gives its share back.
  await held.pop()!.end();
  const again = client('flood', 'flood-secret-0123456789');
  await expect.poll(() => refusal(again.connect()).then((r) => r === null)).toBe(true);
  await again.end();
  for (const c of held) await c.end();
});
