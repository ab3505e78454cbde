// A writer's text reaches Postgres as its bytes were sent, in any client encoding: the connection
// is fenced once, at startup, and the proxy then relays the writer's messages without reading their
// text (an earlier proxy that re-encoded a Query as UTF-8 stored a LATIN1 session's 'café' as
// 'cafï¿½': each byte past ASCII became U+FFFD's three bytes). Invariant: what is stored is the
// writer's text, whatever the statement's shape.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { RawClient, B, E, Q, S } from './raw-client.ts';
import { int16, message } from '../../../src/proxy/sql/wire/framing.ts';
import { startSqlProxy, fenceOptions, type SqlProxy } from '../../support/sql.ts';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db);
  await db.pool.query('CREATE TABLE public.words (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT ON public.words TO ${clientRoleFor(db.url)}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const NUL = Buffer.from([0]);
/** A Query of these bytes (not read as UTF-8 anywhere on the way). */
const Qb = (...parts: (string | Buffer)[]) =>
  message('Q', ...parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'latin1') : p)), NUL);
const Pb = (text: Buffer) => message('P', NUL, text, NUL, int16(0));
const stored = async (id: number) =>
  (await db.pool.query<{ v: string }>('SELECT v FROM public.words WHERE id = $1', [id])).rows.map((r) => r.v);

describe('LATIN1', () => {
  // 'café' in LATIN1: é is the byte 0xE9, not UTF-8.
  const cafe = Buffer.from('café', 'latin1');
  test('every shape of statement keeps the bytes: autocommit, in a block, after BEGIN ISOLATION LEVEL, several statements with COMMIT in one Query, Parse', async () => {
    const raw = await RawClient.connect(sql.port, sql.database, 'latin1', `${fenceOptions(1, 'latin1')} -c client_encoding=LATIN1`);
    expect((await raw.send([Qb("INSERT INTO words VALUES (1, '", cafe, "')")])).errors).toEqual([]);
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    expect((await raw.send([Qb("INSERT INTO words VALUES (2, '", cafe, "')")])).errors).toEqual([]);
    expect((await raw.send([Qb("INSERT INTO words VALUES (3, '", cafe, "')")])).errors).toEqual([]);
    expect((await raw.send([Q('COMMIT')])).errors).toEqual([]);
    expect((await raw.send([Q('BEGIN ISOLATION LEVEL REPEATABLE READ')])).status).toBe('T');
    expect((await raw.send([Qb("INSERT INTO words VALUES (4, '", cafe, "'); COMMIT")])).errors).toEqual([]);
    expect(
      (await raw.send([Pb(Buffer.concat([Buffer.from("INSERT INTO words VALUES (5, '"), cafe, Buffer.from("')")])), B(), E(), S()])).errors,
    ).toEqual([]);
    // Several statements with a transaction word, not UTF-8: Postgres reads them, as sent.
    const several = await raw.send([Qb("INSERT INTO words VALUES (6, '", cafe, "'); COMMIT; SELECT 1")]);
    expect([several.errors, several.tags]).toEqual([[], ['INSERT 0 1', 'COMMIT', 'SELECT 1']]);
    raw.close();
    for (const id of [1, 2, 3, 4, 5, 6]) expect([id, await stored(id)]).toEqual([id, ['café']]);
  });
});

describe('SJIS', () => {
  test('Japanese text, autocommit and in a block', async () => {
    // ソース ("source") in SJIS: 0x83 0x5C 0x81 0x5B 0x83 0x58; 0x5C is a backslash in ASCII.
    const source = Buffer.from([0x83, 0x5c, 0x81, 0x5b, 0x83, 0x58]);
    const raw = await RawClient.connect(sql.port, sql.database, 'sjis', `${fenceOptions(1, 'sjis')} -c client_encoding=SJIS`);
    expect((await raw.send([Qb("INSERT INTO words VALUES (11, '", source, "')")])).errors).toEqual([]);
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    expect((await raw.send([Qb("INSERT INTO words VALUES (12, '", source, "')")])).errors).toEqual([]);
    expect((await raw.send([Q('COMMIT')])).errors).toEqual([]);
    raw.close();
    expect(await stored(11)).toEqual(['ソース']);
    expect(await stored(12)).toEqual(['ソース']);
  });
});
