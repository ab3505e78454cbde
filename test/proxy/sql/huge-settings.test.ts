// Huge arguments on the SQL endpoint (issue 36, "argument sizes are bounded"): a megabyte
// fencepost.token or fencepost.fence_key is refused by its length (FP400) with a refusal that names
// the setting and the limit, not the value; the session stays usable once it sets sane values; no
// refusal or log line carries the megabyte. The proxy reads the settings back cut to their limits
// (fencer.ts READ_SETTINGS_SQL), so the value never crosses to it. No wall-clock assertions: the
// tenancy harness (npm run chaos -- --tenancy S --attacks huge-arguments) measures the latency.
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import pg from 'pg';
import pino from 'pino';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';
import { MessageReader, message } from '../../../src/proxy/sql/wire/framing.ts';
import { MAX_UNFENCED_CHARS, runsUnfenced, setsFenceSetting } from '../../../src/proxy/sql/statements.ts';
import { quoteBounded } from '../../../src/proxy/sql/fencer.ts';

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
const insert = (c: pg.Client) => c.query('INSERT INTO public.items (id, v) VALUES ($1, $2)', [nextId++, 'x']);
const refusalOf = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: pg.DatabaseError) => ({ code: e.code, message: e.message, detail: e.detail ?? '', hint: e.hint ?? '' }),
  );

describe('a megabyte fencepost setting on the SQL endpoint', () => {
  for (const [setting, value, limit] of [
    ['fencepost.token', '9'.repeat(MB), /fencepost\.token is too long: 1048576 bytes, a token is at most 19 digits/],
    ['fencepost.fence_key', `huge/${'k'.repeat(MB)}`, /fencepost\.fence_key is too long: 1048581 bytes, a fence key is at most 1024 bytes/],
  ] as const) {
    test(`${setting}: FP400 naming the setting and its limit, bounded; the session goes on with sane settings`, async () => {
      const key = `huge-${setting}`;
      const c = await sql.connect(`writer-${setting}`, { options: fenceOptions(7, key) });
      try {
        await insert(c); // fenced at token 7
        const logged = logLines.length;
        // Longer than statements.ts MAX_UNFENCED_CHARS: it runs fenced (at token 7), and lands.
        await c.query(`SET ${setting} = '${value}'`);
        for (const attempt of [insert(c), c.query('SELECT 1')]) {
          const r = await refusalOf(attempt);
          expect(r).toMatchObject({ code: 'FP400', message: expect.stringMatching(limit) });
          expect(Buffer.byteLength(r!.message + r!.detail + r!.hint)).toBeLessThan(BOUNDED);
        }
        // Nothing of the value in a log line, and no long line.
        for (const line of logLines.slice(logged)) {
          expect(line.length).toBeLessThan(BOUNDED);
          expect(line).not.toContain(value.slice(-100));
        }
        // Sane settings again, each a lone SET (it runs unfenced): the next transaction is fenced with them and writes.
        await c.query(`SET fencepost.fence_key = '${key}'`);
        await c.query("SET fencepost.token = '8'");
        await insert(c);
        expect(
          (await db.pool.query<{ t: string }>('SELECT highest_token::text AS t FROM fencepost.fences WHERE fence_key = $1', [key])).rows[0]
            ?.t,
        ).toBe('8');
      } finally {
        await c.end();
      }
    });
  }

  test('a token just past the 64-character limit is refused by its length; with leading zeros within it, it is a token', async () => {
    const c = await sql.connect('writer-zeros', { options: fenceOptions(`${'0'.repeat(60)}3`, 'zeros') });
    try {
      await insert(c);
      await c.query(`SET fencepost.token = '${'0'.repeat(64)}4'`);
      expect(await refusalOf(insert(c))).toMatchObject({
        code: 'FP400',
        message: expect.stringMatching(/fencepost\.token is too long: 65 bytes/),
      });
      await c.query(`SET fencepost.token = '${'9'.repeat(20)}'`);
      const r = await refusalOf(insert(c));
      expect(r).toMatchObject({
        code: 'FP400',
        message: `fencepost.token must be decimal digits, 0 to 9223372036854775807, got "${'9'.repeat(20)}"`,
      });
      await c.query("SET fencepost.token = '0005'");
      await insert(c);
    } finally {
      await c.end();
    }
  });
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

  test('a text past MAX_UNFENCED_CHARS is never a statement that runs unfenced (fenced, unparsed)', () => {
    const huge = `SET fencepost.token = '${'9'.repeat(MAX_UNFENCED_CHARS)}'`;
    expect([runsUnfenced(huge), setsFenceSetting(huge)]).toEqual([false, false]);
    expect([runsUnfenced("SET fencepost.token = '9'"), setsFenceSetting("SET fencepost.token = '9'")]).toEqual([true, true]);
  });

  test('client text quoted into a refusal is cut, with its length', () => {
    expect(quoteBounded('orders/1')).toBe('"orders/1"');
    const q = quoteBounded('x'.repeat(MB));
    expect(q).toMatch(/^"x{64}"… \(1048576 bytes\)$/);
  });
});
