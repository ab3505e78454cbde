// Huge arguments on the SQL endpoint (issue 36, "argument sizes are bounded"). The connection is
// fenced once, at startup, from its startup settings: a fencepost.token or fencepost.fence_key
// longer than its limit is refused then by its length (FATAL FP400), with a refusal that names the
// setting and the limit, not the value. After startup the proxy never reads the settings: a
// megabyte SET goes to Postgres as any SET, and protected tables refuse the connection's writes
// (FP400, naming the startup token) until it RESETs them. No refusal or log line carries the
// value. No wall-clock assertions: the tenancy harness (npm run chaos -- --tenancy S --attacks
// huge-arguments) measures the latency.
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import pg from 'pg';
import pino from 'pino';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { MessageReader, message } from '../../../src/proxy/sql/wire/framing.ts';
import { quoteBounded } from '../../../src/fence/session-fence.ts';
import { protectTable } from '../../../src/fence/protect.ts';

const MB = 1024 * 1024;
/** A refusal's text, and a log line, stay below this many bytes whatever the client sent. */
const BOUNDED = 2048;

let db: TestDatabase;
let sql: SqlProxy;
const logLines: string[] = [];
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db, {}, { logger: pino({ level: 'debug' }, { write: (line: string) => void logLines.push(line) }) });
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO ${clientRoleFor(db.url)}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

let nextId = 1;
const insert = (c: pg.Client, table = 'items') => c.query(`INSERT INTO public.${table} (id) VALUES ($1)`, [nextId++]);
const refusalOf = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: pg.DatabaseError) => ({ code: e.code, message: e.message, detail: e.detail ?? '', hint: e.hint ?? '' }),
  );
/** A table of its own, protected by `fenceKey`, that the client role may write. */
async function guardedTable(name: string, fenceKey: string): Promise<void> {
  await db.pool.query(`CREATE TABLE public.${name} (id int PRIMARY KEY)`);
  await db.pool.query(`GRANT SELECT, INSERT ON public.${name} TO ${clientRoleFor(db.url)}`);
  await protectTable(db.pool, `public.${name}`, fenceKey);
}
/** Nothing of `value` in a log line since `from`, and no long line. */
function logsBounded(from: number, value: string): void {
  for (const line of logLines.slice(from)) {
    expect(line.length).toBeLessThan(BOUNDED);
    expect(line).not.toContain(value.slice(-100));
  }
}

describe('a long fencepost setting in the startup options', () => {
  // Within the startup packet's 10000 bytes (startup.test.ts: a longer packet is refused 08P01).
  for (const [setting, value, token, fenceKey, limit] of [
    [
      'fencepost.token',
      '9'.repeat(5000),
      '9'.repeat(5000),
      'long/token',
      /^fencepost\.token is too long: 5000 bytes, a token is at most 19 digits/,
    ],
    [
      'fencepost.fence_key',
      `long/${'k'.repeat(5000)}`,
      '1',
      `long/${'k'.repeat(5000)}`,
      /^fencepost\.fence_key is too long: 5005 bytes, a fence key is at most 1024 bytes$/,
    ],
  ] as const) {
    test(`${setting}: refused at connect with FATAL FP400 naming the setting and its limit, bounded; no fence row, no log line carries it`, async () => {
      const logged = logLines.length;
      const r = await refusalOf(sql.connect(`writer-${setting}`, { options: fenceOptions(token, fenceKey) }));
      expect(r).toMatchObject({ code: 'FP400', message: expect.stringMatching(limit) });
      expect(Buffer.byteLength(r!.message + r!.detail + r!.hint)).toBeLessThan(BOUNDED);
      expect(await fenceRow(db.pool, fenceKey)).toBeUndefined();
      logsBounded(logged, value);
    });
  }

  test('a token just past the 64-character limit is refused by its length; with leading zeros within it, it is a token', async () => {
    expect(await refusalOf(sql.connect('writer-zeros', { options: fenceOptions(`${'0'.repeat(64)}4`, 'zeros') }))).toMatchObject({
      code: 'FP400',
      message: expect.stringMatching(/^fencepost\.token is too long: 65 bytes/),
    });
    expect(await refusalOf(sql.connect('writer-zeros', { options: fenceOptions('9'.repeat(20), 'zeros') }))).toMatchObject({
      code: 'FP400',
      message: `fencepost.token must be decimal digits, 0 to 9223372036854775807, got "${'9'.repeat(20)}"`,
    });
    const c = await sql.connect('writer-zeros', { options: fenceOptions(`${'0'.repeat(60)}3`, 'zeros') });
    try {
      await insert(c);
    } finally {
      await c.end();
    }
    expect(await fenceRow(db.pool, 'zeros')).toEqual({ highest_token: '3' });
  });
});

describe('a megabyte fencepost setting SET after startup', () => {
  // Invariant: the proxy reads no setting after startup, so the megabyte never crosses to it; the
  // connection stays fenced at its startup pair, its protected table refuses it while the
  // settings differ (FP400, bounded), and nothing re-fences it.
  for (const [setting, value] of [
    ['fencepost.token', '9'.repeat(MB)],
    ['fencepost.fence_key', `huge/${'k'.repeat(MB)}`],
  ] as const) {
    test(`${setting}: Postgres takes the SET; a protected write is refused FP400, bounded; after RESET the connection writes at its startup token`, async () => {
      const key = `huge-${setting}`;
      const table = `huge_${setting.replace('fencepost.', '')}`;
      await guardedTable(table, key);
      const c = await sql.connect(`writer-${setting}`, { options: fenceOptions(7, key) });
      try {
        await insert(c, table); // fenced at token 7
        const logged = logLines.length;
        await c.query(`SET ${setting} = '${value}'`);
        const r = await refusalOf(insert(c, table));
        expect(r).toMatchObject({
          code: 'FP400',
          message: expect.stringContaining('was changed after this connection was fenced at token 7'),
        });
        expect(Buffer.byteLength(r!.message + r!.detail + r!.hint)).toBeLessThan(BOUNDED);
        // An unprotected table is written as the startup pair.
        await insert(c);
        logsBounded(logged, value);
        await c.query(`RESET ${setting}`);
        await insert(c, table);
      } finally {
        await c.end();
      }
      expect((await db.pool.query(`SELECT count(*)::int AS n FROM public.${table}`)).rows).toEqual([{ n: 2 }]);
      expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '7' });
    });
  }
});

describe('per-byte work on huge input', () => {
  test('a 4 MB message in 1 KB chunks frames with one copy of its bytes, not one per chunk', () => {
    const m = message('Q', 'k'.repeat(4 * MB));
    const r = new MessageReader();
    const concat = vi.spyOn(Buffer, 'concat');
    try {
      let frame = null;
      for (let i = 0; i < m.length; i += 1024) {
        r.push(m.subarray(i, i + 1024));
        frame = r.next() ?? frame;
      }
      expect(frame?.bytes.equals(m)).toBe(true);
      const copied = concat.mock.calls.reduce((n, [list]) => n + list.reduce((k, b) => k + b.length, 0), 0);
      expect(copied).toBeLessThanOrEqual(m.length);
    } finally {
      concat.mockRestore();
    }
    expect(r.pending).toBe(0);
  });

  test('client text quoted into a refusal is cut, with its length', () => {
    expect(quoteBounded('orders/1')).toBe('"orders/1"');
    const q = quoteBounded('x'.repeat(MB));
    expect(q).toMatch(/^"x{64}"… \(1048576 bytes\)$/);
  });
});
