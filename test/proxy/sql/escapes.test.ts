// Ways a writer could end the fenced transaction on purpose and go on in one the proxy did not
// fence (issue 15): COMMIT / ROLLBACK / END / … AND CHAIN in the middle of a multi-statement
// Query or of an extended-protocol pipeline, DO blocks and procedures that COMMIT, PREPARE
// TRANSACTION, dollar-quoted and commented spellings, each followed by lifting the read-only
// backstop (SET default_transaction_read_only = off, SET TRANSACTION READ WRITE, set_config).
// With a STALE token none of them may leave a row behind or move the fence; a leader with the
// current token still runs ordinary multi-statement queries and pipelines.
//
// A stale session's first statement fails at the fence, so the escapes start from there: a
// failed transaction ('E'), where the proxy injects nothing (the writer's ROLLBACK must go through).
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { RawClient, B, CLOSE, E, P, Q, S, pbe } from './raw-client.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { RW_SQL } from '../../../src/proxy/sql/proof.ts';
import pg from 'pg';

const run = promisify(execFile);
const PSQL = '/usr/bin/psql';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db);
  const role = clientRoleFor(db.url);
  await db.pool.query('CREATE TABLE public.items (id int PRIMARY KEY, v text)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO ${role}`);
  // A procedure that lifts the read-only default, commits the fenced transaction and writes on.
  await db.pool.query(`CREATE PROCEDURE public.commit_and_write(n int) LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM set_config('default_transaction_read_only', 'off', false);
      COMMIT;
      INSERT INTO public.items VALUES (n, 'procedure');
    END $$`);
  await db.pool.query(`GRANT EXECUTE ON PROCEDURE public.commit_and_write(int) TO ${role}`);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const ids = { next: 1 };
const id = () => ids.next++;
const present = async (...ns: number[]) =>
  (await db.pool.query<{ id: number }>('SELECT id FROM public.items WHERE id = ANY($1) ORDER BY id', [ns])).rows.map((r) => r.id);
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
const raise = async (fenceKey: string, token: number) => {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token) },
  });
  expect(res.status).toBe(200);
};

const Raw = { connect: (user: string, options: string) => RawClient.connect(sql.port, sql.database, user, options) };

/**
 * A session whose token went stale, inside a failed transaction (its BEGIN met the fence). Not a
 * lone BEGIN: when the fence after one fails the proxy rolls the block back (the session is idle).
 */
async function staleInFailedBlock(fenceKey: string): Promise<RawClient> {
  const raw = await Raw.connect(`zombie-${fenceKey}`, fenceOptions(10, fenceKey));
  await raise(fenceKey, 11);
  const begin = await raw.send([Q('BEGIN; SELECT 1')]);
  expect(begin).toMatchObject({ errors: ['FP409'], status: 'E' });
  return raw;
}

const LIFT = 'SET default_transaction_read_only = off; SET TRANSACTION READ WRITE';
const LIFT_SET_CONFIG =
  "SELECT set_config('default_transaction_read_only', 'off', false), set_config('transaction_read_only', 'off', true)";

describe('the read-write statement the fence runs first', () => {
  // Invariant: it makes only its own transaction read-write, and says nothing doing it (no
  // warning in the server log, no notice) in the implicit transaction of an autocommit statement.
  test('straight to Postgres: no notice in an implicit transaction, and the next transaction is read-only again', async () => {
    const c = new pg.Client({ connectionString: db.url, options: '-c default_transaction_read_only=on' });
    await c.connect();
    const notices: string[] = [];
    c.on('notice', (n) => notices.push(n.message ?? ''));
    try {
      await c.query(Object.assign({ text: RW_SQL }, { queryMode: 'extended' as const }));
      await c.query(`BEGIN; ${RW_SQL}; INSERT INTO public.items VALUES (${id()}, 'rw'); COMMIT`);
      expect(notices).toEqual([]);
      expect((await c.query('SHOW transaction_read_only')).rows[0].transaction_read_only).toBe('on');
      expect(await code(c.query(`INSERT INTO public.items VALUES (${id()}, 'after')`))).toBe('25006');
    } finally {
      await c.end();
    }
  });

  test('through the endpoint: an autocommit write with a token commits; the same session without one writes nothing', async () => {
    await raise('rw-once', 3);
    const c = await sql.connect('rw-once', { options: fenceOptions(3, 'rw-once') });
    const [a, b] = [id(), id()];
    try {
      await c.query({ text: 'INSERT INTO public.items VALUES ($1, $2)', values: [a, 'fenced'] });
      await c.query("SET fencepost.token = ''");
      expect(await code(c.query({ text: 'INSERT INTO public.items VALUES ($1, $2)', values: [b, 'tokenless'] }))).toBe('25006');
    } finally {
      await c.end();
    }
    expect(await present(a, b)).toEqual([a]);
  });
});

describe('simple protocol: a transaction ended in the middle of a Query is fenced again', () => {
  const escapes: [string, (n: number) => string][] = [
    ['ROLLBACK', (n) => `ROLLBACK; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`],
    ['COMMIT', (n) => `COMMIT; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`],
    ['END', (n) => `END; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`],
    ['ABORT', (n) => `ABORT; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`],
    ['ROLLBACK AND CHAIN', (n) => `ROLLBACK AND CHAIN; SET TRANSACTION READ WRITE; INSERT INTO items VALUES (${n}, 'escaped'); COMMIT`],
    ['ROLLBACK then set_config', (n) => `ROLLBACK; ${LIFT_SET_CONFIG}; INSERT INTO items VALUES (${n}, 'escaped')`],
    [
      'ROLLBACK, COMMIT AND CHAIN',
      (n) => `ROLLBACK; BEGIN; COMMIT AND CHAIN; SET TRANSACTION READ WRITE; INSERT INTO items VALUES (${n}, 'escaped'); COMMIT`,
    ],
    [
      'a commented ROLLBACK',
      (n) => `/* a /* nested */ comment; */ ROLLBACK -- ; not here\n; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`,
    ],
    [
      'dollar quotes around semicolons',
      (n) => `ROLLBACK; SELECT $x$ ; COMMIT ; $x$; ${LIFT}; INSERT INTO items VALUES (${n}, $$escaped; COMMIT$$)`,
    ],
    [
      'E-strings and quoted identifiers',
      (n) => `ROLLBACK; SELECT E'\\'; COMMIT; ' AS "a;b"; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`,
    ],
    [
      'a DO block that commits and writes',
      (n) =>
        `ROLLBACK; DO $do$BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); COMMIT; INSERT INTO items VALUES (${n}, 'do'); END$do$`,
    ],
    ['a procedure that commits and writes', (n) => `ROLLBACK; CALL commit_and_write(${n})`],
    [
      'PREPARE TRANSACTION',
      (n) => `ROLLBACK; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped'); PREPARE TRANSACTION 'fencepost_escape_${n}'`,
    ],
  ];
  for (const [name, text] of escapes) {
    test(`${name}: a stale writer writes nothing and the fence stays`, async () => {
      const key = `simple-${name}`;
      const raw = await staleInFailedBlock(key);
      const n = id();
      const res = await raw.send([Q(text(n))]);
      expect(res.errors[0]).toBe('FP409');
      await raw.send([Q('ROLLBACK')]);
      raw.close();
      expect(await present(n)).toEqual([]);
      expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '11' });
      expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE database = current_database()')).rows).toEqual([]);
    });
  }

  test('node-postgres: ROLLBACK in the middle of a Query after a stale BEGIN', async () => {
    const c = await sql.connect('zombie-pg', { options: fenceOptions(10, 'simple-pg') });
    await raise('simple-pg', 11);
    expect(await code(c.query('BEGIN; SELECT 1'))).toBe('FP409');
    const n = id();
    expect(await code(c.query(`ROLLBACK; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`))).toBe('FP409');
    expect(await present(n)).toEqual([]);
    await c.end();
  });

  test('ROLLBACK AND CHAIN alone: the chained transaction is fenced before the writer lifts read-only in it', async () => {
    const c = await sql.connect('chain', { options: fenceOptions(10, 'chain') });
    await raise('chain', 11);
    expect(await code(c.query('BEGIN; SELECT 1'))).toBe('FP409');
    expect(await code(c.query('ROLLBACK AND CHAIN'))).toBe('FP409');
    const n = id();
    expect(await code(c.query('SET TRANSACTION READ WRITE'))).toBe('25P02');
    expect(await code(c.query(`INSERT INTO items VALUES (${n}, 'chained')`))).toBe('25P02');
    await c.query('COMMIT');
    expect(await present(n)).toEqual([]);
    expect(await fenceRow(db.pool, 'chain')).toEqual({ highest_token: '11' });
    await c.end();
  });

  // Invariant: no statement of a session runs outside a fenced transaction. A statement that
  // cannot run in a transaction block is fenced like any other, so Postgres refuses it (25001)
  // for the leader, and a zombie's fails at the fence (FP409); only DISCARD / CHECKPOINT go
  // unfenced. The client login may maintain the table (MAINTAIN), so a refusal is the fence's doing.
  test('statements that cannot run in a transaction block are refused, never run unfenced', async () => {
    await db.pool.query(`GRANT MAINTAIN ON public.items TO ${clientRoleFor(db.url)}`);
    await raise('maint', 5);
    const leader = await sql.connect('maint-leader', { options: fenceOptions(5, 'maint') });
    await leader.query('SET default_transaction_read_only = off');
    for (const stmt of [
      'VACUUM public.items',
      '/* c */ vacuum (analyze) public.items',
      'CLUSTER',
      'REINDEX TABLE CONCURRENTLY public.items',
      'CREATE INDEX CONCURRENTLY items_v ON public.items (v)',
      'DROP INDEX CONCURRENTLY IF EXISTS public.items_pkey',
    ]) {
      expect([stmt, await code(leader.query(stmt))]).toEqual([stmt, '25001']);
    }
    expect(await code(leader.query('DISCARD ALL'))).toBe('ok');
    await leader.end();
    const zombie = await sql.connect('maint-zombie', { options: fenceOptions(4, 'maint') });
    expect(await code(zombie.query('VACUUM public.items'))).toBe('FP409');
    await zombie.end();
    expect((await db.pool.query("SELECT 1 FROM pg_indexes WHERE indexname = 'items_v'")).rowCount).toBe(0);
    expect(await fenceRow(db.pool, 'maint')).toEqual({ highest_token: '5' });
  });

  test('a session that turns standard_conforming_strings off runs one statement per Query', async () => {
    const c = await sql.connect('scs', { options: fenceOptions(1, 'scs') });
    await c.query('SET standard_conforming_strings = off');
    const n = id();
    expect(await code(c.query(`SELECT 'a\\'; COMMIT; INSERT INTO items VALUES (${n}, 'x')`))).toBe('0A000');
    expect(await present(n)).toEqual([]);
    expect((await c.query("SELECT 'still works' AS v")).rows).toEqual([{ v: 'still works' }]);
    await c.end();
  });

  // Invariant: text the server could lex otherwise than the parser here never goes unfenced. A
  // lone `SET fencepost.token` goes without the fence (so a stale session can take a new token);
  // with standard_conforming_strings off, `'a\', '` is one string to the server and two to the
  // parser, and in SJIS the byte 0x5C after 0x83 is part of a character to the server and a
  // backslash to the parser. Each text below was one SET to the parser and a SET, an INSERT (and a
  // COMMIT) to the server: before, the INSERT of a stale session committed.
  const smuggled = (n: number, quote = "'a\\', '") =>
    `SET fencepost.token = ${quote}; SET transaction_read_only = off; INSERT INTO items VALUES (${n}, $$smuggled$$); --'`;
  const sjis = (n: number) =>
    Buffer.concat([
      Buffer.from("SET fencepost.fence_key = E'", 'latin1'),
      Buffer.from([0x83, 0x5c]), // katakana SO in SJIS; its second byte is a backslash in ASCII
      Buffer.from(`'; SET transaction_read_only = off; INSERT INTO items VALUES (${n}, $$smuggled$$); --'`, 'latin1'),
    ]);
  const Qbytes = (bytes: Buffer) => message('Q', Buffer.concat([bytes, Buffer.from([0])]));
  test.each([
    ['standard_conforming_strings off', '-c standard_conforming_strings=off', (n: number) => Q(smuggled(n))],
    ['client_encoding SJIS', '-c client_encoding=SJIS', (n: number) => Qbytes(sjis(n))],
  ])("%s: a stale session's SET that hides an INSERT is fenced, and an ASCII SET still takes a new token", async (name, setting, text) => {
    const key = `lexing-${name}`;
    await raise(key, 10);
    const raw = await Raw.connect(`zombie-${key}`, `${fenceOptions(10, key)} ${setting}`);
    await raise(key, 11);
    const [n, m] = [id(), id()];
    const r = await raw.send([text(n)]);
    expect(r.errors).toHaveLength(1);
    expect(r.errors[0]).not.toBe('00000');
    // Held BEGIN first: the SET after it goes unfenced only when it is one to the server.
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    const held = await raw.send([Q(smuggled(m).replace('--', `COMMIT; --`))]);
    expect(held.errors).toHaveLength(1);
    await raw.send([Q('ROLLBACK')]);
    expect(await present(n, m)).toEqual([]);
    // Plain ASCII lexes alike: the SET goes unfenced and the session writes with its new token.
    expect((await raw.send([Q('SET fencepost.token = 11')])).errors).toEqual([]);
    const k = id();
    expect((await raw.send([Q(`INSERT INTO items VALUES (${k}, 'new token')`)])).errors).toEqual([]);
    expect(await present(k)).toEqual([k]);
    raw.close();
    expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '11' });
  });

  test('a tokenless session with standard_conforming_strings off: the hidden INSERT is refused', async () => {
    const raw = await Raw.connect('nobody-scs', '-c standard_conforming_strings=off');
    const n = id();
    expect((await raw.send([Q(smuggled(n))])).errors).toHaveLength(1);
    raw.close();
    expect(await present(n)).toEqual([]);
  });

  test('text the parser refuses is refused whole (42601), nothing run', async () => {
    const c = await sql.connect('syntax', { options: fenceOptions(1, 'syntax') });
    const n = id();
    expect(await code(c.query(`INSERT INTO items VALUES (${n}, 'x'); COMMIT; SELEC 1`))).toBe('42601');
    expect(await present(n)).toEqual([]);
    await c.end();
  });
});

describe('a Query that looks empty to a careless lexer', () => {
  // Invariant: a Query gets no fence only when the server finds no statement in it. A `--` comment
  // ends at \r as well as \n, and block comments nest, so each of these holds an INSERT: a stale
  // session's gets FP409 and leaves no row (before, `-- x\rINSERT …` went unfenced and committed).
  // A Query that holds only blanks, comments and `;` still gets its EmptyQueryResponse, unfenced.
  const hidden: [string, (n: number) => string][] = [
    ['a dash comment ended by \\r', (n) => `-- nothing here\rINSERT INTO items VALUES (${n}, 'hidden')`],
    ['a nested block comment', (n) => `/* a /* b */ still a comment */ INSERT INTO items VALUES (${n}, 'hidden')`],
    ['semicolons and comments first', (n) => `; -- x\r; /* y */ INSERT INTO items VALUES (${n}, 'hidden')`],
  ];
  for (const [name, text] of hidden) {
    test(`behind ${name}: a stale writer's INSERT is fenced and writes nothing`, async () => {
      const key = `hidden-${name}`;
      const raw = await Raw.connect(`zombie-${key}`, fenceOptions(10, key));
      await raise(key, 11);
      const n = id();
      const res = await raw.send([Q(text(n))]);
      expect({ errors: res.errors, status: res.status }).toEqual({ errors: ['FP409'], status: 'I' });
      raw.close();
      expect(await present(n)).toEqual([]);
      expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '11' });
    });
  }

  test("a BEGIN followed by U+00A0 (part of the word to the server): its syntax error at once, and the stale writer's next INSERT is fenced", async () => {
    // Before, the proxy answered it as a BEGIN and sent it later with the proof; it failed there,
    // and the writer's INSERT behind it ran in a transaction of its own, unfenced, and committed.
    const key = 'hidden-begin';
    const raw = await Raw.connect(`zombie-${key}`, fenceOptions(10, key));
    await raise(key, 11);
    const n = id();
    expect(await raw.send([Q('BEGIN\u00a0')])).toMatchObject({ errors: ['42601'], status: 'I' });
    expect(await raw.send([Q(`INSERT INTO items VALUES (${n}, 'hidden')`)])).toMatchObject({ errors: ['FP409'], status: 'I' });
    raw.close();
    expect(await present(n)).toEqual([]);
  });

  test('only blanks, comments and semicolons: an EmptyQueryResponse, for a stale writer too', async () => {
    const key = 'hidden-empty';
    const raw = await Raw.connect(`zombie-${key}`, fenceOptions(10, key));
    await raise(key, 11);
    for (const text of ['-- x\r', ' /* a /* b */ c */ ;', ';\r\n; -- tail']) {
      const res = await raw.send([Q(text)]);
      expect({ text, empty: res.frames.map((f) => f.type), errors: res.errors }).toEqual({ text, empty: ['I', 'Z'], errors: [] });
    }
    raw.close();
  });
});

describe('extended protocol: a pipeline that ends the transaction before Sync', () => {
  test('Execute of ROLLBACK, then SET TRANSACTION READ WRITE and INSERT: the fence runs before them', async () => {
    const raw = await staleInFailedBlock('ext-rollback');
    const n = id();
    const res = await raw.send([
      ...pbe('ROLLBACK'),
      ...pbe('SET TRANSACTION READ WRITE'),
      ...pbe(`INSERT INTO items VALUES (${n}, 'escaped')`),
      S(),
    ]);
    expect(res.errors).toEqual(['FP409']);
    raw.close();
    expect(await present(n)).toEqual([]);
    expect(await fenceRow(db.pool, 'ext-rollback')).toEqual({ highest_token: '11' });
  });

  test('Execute of COMMIT between writes, with set_config and several Syncs', async () => {
    const raw = await staleInFailedBlock('ext-commit');
    const [x, y] = [id(), id()];
    const res = await raw.send(
      [
        ...pbe('COMMIT'),
        ...pbe(LIFT_SET_CONFIG),
        ...pbe(`INSERT INTO items VALUES (${x}, 'escaped')`),
        S(),
        ...pbe(`INSERT INTO items VALUES (${y}, 'escaped')`),
        S(),
      ],
      2,
    );
    expect(res.errors).toEqual(['FP409', 'FP409']);
    raw.close();
    expect(await present(x, y)).toEqual([]);
  });

  test('Execute of ROLLBACK AND CHAIN, then a write: fenced right after the chain', async () => {
    const raw = await staleInFailedBlock('ext-chain');
    const n = id();
    const res = await raw.send([
      ...pbe('ROLLBACK AND CHAIN'),
      ...pbe('SET TRANSACTION READ WRITE'),
      ...pbe(`INSERT INTO items VALUES (${n}, 'escaped')`),
      ...pbe('COMMIT'),
      S(),
    ]);
    expect(res.errors).toEqual(['FP409']);
    await raw.send([Q('ROLLBACK')]);
    raw.close();
    expect(await present(n)).toEqual([]);
  });

  test('named statements: a COMMIT prepared once and bound later', async () => {
    const raw = await staleInFailedBlock('ext-named');
    const n = id();
    const res = await raw.send([
      P('/* c */ END', 'fin'),
      B('fin'),
      E(),
      P(`INSERT INTO items VALUES (${n}, 'escaped')`, 'ins'),
      P(LIFT_SET_CONFIG),
      B(),
      E(),
      B('ins'),
      E(),
      S(),
    ]);
    expect(res.errors).toEqual(['FP409']);
    raw.close();
    expect(await present(n)).toEqual([]);
  });

  test('DO and CALL outside a transaction block are refused (0A000) even for the current leader; inside one Postgres refuses their COMMIT', async () => {
    const c = await sql.connect('leader-do', { options: fenceOptions(1, 'ext-do') });
    const [x, y, z] = [id(), id(), id()];
    expect(await code(c.query('CALL commit_and_write($1)', [x]))).toBe('0A000');
    const raw = await Raw.connect('leader-do-raw', fenceOptions(1, 'ext-do'));
    const res = await raw.send([
      ...pbe(
        `DO $$BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); COMMIT; INSERT INTO items VALUES (${y}, 'do'); END$$`,
      ),
      S(),
    ]);
    expect(res.errors).toEqual(['0A000']);
    const inBlock = await raw.send([...pbe('BEGIN'), ...pbe(`CALL commit_and_write(${z})`), S()]);
    expect(inBlock.errors).toEqual(['2D000']);
    await raw.send([Q('ROLLBACK')]);
    raw.close();
    expect(await present(x, y, z)).toEqual([]);
    await c.end();
  });

  test("a stale writer's DO after an Execute of ROLLBACK", async () => {
    const raw = await staleInFailedBlock('ext-do-stale');
    const n = id();
    const res = await raw.send([
      ...pbe('ROLLBACK'),
      ...pbe(
        `DO $$BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); COMMIT; INSERT INTO items VALUES (${n}, 'do'); END$$`,
      ),
      S(),
    ]);
    expect(res.errors).toEqual(['FP409']);
    raw.close();
    expect(await present(n)).toEqual([]);
  });
});

describe('extended protocol: what a group opens with is not what runs first', () => {
  // Invariant: no Execute of a stale or tokenless session runs a write before the fence, whatever
  // the group's first message promised. Each case committed its row before its fix.

  test('a block that owes its fence, a group that opens with a Parse of COMMIT it never runs: the INSERT gets the fence', async () => {
    const key = 'owed-commit-parse';
    const raw = await Raw.connect('owed-commit-parse', fenceOptions(10, key));
    await raise(key, 11);
    // A held BEGIN, then a SET of the token: the block owes its fence to its next statement, unless that ends it.
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    expect((await raw.send([Q('SET fencepost.token = 10')])).errors).toEqual([]);
    const n = id();
    const write = await raw.send([P('COMMIT'), P(`INSERT INTO items VALUES (${n}, 'owed')`), B(), E(), S()]);
    expect(write.errors).toEqual(['FP409']);
    await raw.send([Q('COMMIT')]);
    // A BEGIN in a group of its own owes the same, tokenless.
    const nobody = await Raw.connect('owed-commit-parse-nobody', '');
    expect((await nobody.send([P('BEGIN READ WRITE'), B(), E(), S()])).status).toBe('T');
    const m = id();
    expect((await nobody.send([P('COMMIT'), P(`INSERT INTO items VALUES (${m}, 'owed')`), B(), E(), S()])).errors).toEqual(['25006']);
    await nobody.send([Q('COMMIT')]);
    expect(await present(n, m)).toEqual([]);
    // A group that runs the COMMIT it opens with still commits the SET unfenced (a stale session takes a new token so).
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    expect((await raw.send([Q('SET fencepost.token = 11')])).errors).toEqual([]);
    expect(await raw.send([P('COMMIT'), B(), E(), S()])).toMatchObject({ errors: [], tags: ['COMMIT'], status: 'I' });
    const k = id();
    expect((await raw.send([Q(`INSERT INTO items VALUES (${k}, 'new token')`)])).errors).toEqual([]);
    expect(await present(k)).toEqual([k]);
    raw.close();
    nobody.close();
  });

  test('a Parse of SET fencepost.token the backend refuses (name taken) leaves the name a write, fenced', async () => {
    const key = 'refused-setting-parse';
    const raw = await Raw.connect('refused-setting-parse', fenceOptions(10, key));
    const n = id();
    expect((await raw.send([P(`INSERT INTO items VALUES (${n}, 'w')`, 'w'), S()])).errors).toEqual([]);
    expect((await raw.send([P('SET fencepost.token = 10', 'w'), S()])).errors).toEqual(['42P05']);
    await raise(key, 11);
    expect((await raw.send([B('w'), E(), S()])).errors).toEqual(['FP409']);
    raw.close();
    expect(await present(n)).toEqual([]);
    expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '11' });
  });

  test('a named BEGIN or COMMIT swapped for an INSERT where the proxy cannot see it (PREPARE in a DO block) puts no fence off', async () => {
    // SQL PREPARE and DEALLOCATE in a DO block replace a named statement; only the unnamed one,
    // which the protocol alone makes, is trusted to be the BEGIN or COMMIT it was parsed as.
    const key = 'named-swap';
    const raw = await Raw.connect('named-swap', fenceOptions(10, key));
    const swap = (name: string, text: string) =>
      Q(`BEGIN; DO $$BEGIN EXECUTE 'DEALLOCATE ${name}'; EXECUTE 'PREPARE ${name} AS ${text.replaceAll("'", "''")}'; END$$; COMMIT`);
    const [n, m] = [id(), id()];
    expect((await raw.send([P('BEGIN', 'b'), P('COMMIT', 'c'), S()])).errors).toEqual([]);
    expect((await raw.send([swap('b', `INSERT INTO items VALUES (${n}, 'b')`)])).errors).toEqual([]);
    expect((await raw.send([swap('c', `INSERT INTO items VALUES (${m}, 'c')`)])).errors).toEqual([]);
    await raise(key, 11);
    // The group opens with Bind of "BEGIN" on a named portal, runs it and syncs.
    expect((await raw.send([B('b', 'p'), E('p'), S()])).errors).toEqual(['FP409']);
    // A block owing its fence (held BEGIN, SET fencepost.token), then Bind of "COMMIT".
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    expect((await raw.send([Q('SET fencepost.token = 10')])).errors).toEqual([]);
    expect((await raw.send([P('COMMIT'), B('c'), E(), S()])).errors).toEqual(['FP409']);
    await raw.send([Q('ROLLBACK')]);
    raw.close();
    expect(await present(n, m)).toEqual([]);
  });

  test('a Parse the parser splits where the server does not (standard_conforming_strings off, SJIS) is no BEGIN to the proxy', async () => {
    // The server takes one statement per Parse. `INSERT … 'x\'; BEGIN; -- '` is one INSERT to a
    // server with standard_conforming_strings off, an INSERT and a BEGIN to the parser; read as a
    // BEGIN it put the fence after its Execute, and a stale session's INSERT committed at the Sync.
    const sjisText = (n: number) =>
      Buffer.concat([
        Buffer.from(`INSERT INTO items SELECT ${n}, E'`, 'latin1'),
        Buffer.from([0x95, 0x5c]), // 表 in SJIS; its second byte is a backslash in ASCII
        Buffer.from("' || '; BEGIN; -- '", 'latin1'),
      ]);
    const Pbytes = (text: Buffer) => message('P', Buffer.from([0]), text, Buffer.from([0]), Buffer.from([0, 0]));
    for (const [setting, parse] of [
      ['-c standard_conforming_strings=off', (n: number) => P(`INSERT INTO items SELECT ${n}, 'x\\'; BEGIN; -- '`)],
      ['-c client_encoding=SJIS', (n: number) => Pbytes(sjisText(n))],
    ] as const) {
      const key = `parse-kind ${setting}`;
      await raise(key, 10);
      const raw = await Raw.connect('parse-kind', `${fenceOptions(10, key)} ${setting}`);
      await raise(key, 11);
      const n = id();
      const r = await raw.send([parse(n), B(), E(), S()]);
      expect([setting, r.errors]).toEqual([setting, ['FP409']]);
      raw.close();
      expect(await present(n)).toEqual([]);
    }
  });

  test('a SET of client_encoding or standard_conforming_strings earlier in the group counts before its ReadyForQuery', async () => {
    // Postgres reports a changed setting only with its ReadyForQuery; until then the proxy takes the
    // session as one that lexes and keys names otherwise. Before, a tokenless session (the same for
    // a leader whose token a raise made stale mid-group) committed an INSERT both ways.
    const NUL = Buffer.from([0]);
    const Pn = (name: Buffer, text: string) => message('P', name, NUL, text, Buffer.from([0, 0]));
    const Bn = (statement: Buffer) => message('B', NUL, statement, NUL, Buffer.from([0, 0, 0, 0, 0, 0]));
    // 32 × é and a letter: 33 bytes in LATIN1, 65 in UTF-8, where Postgres keys names by 63 bytes.
    const nm = (c: string) => Buffer.concat([Buffer.alloc(32, 0xe9), Buffer.from(c)]);
    const raw = await Raw.connect('settings-mid-group', '');
    const [n, m] = [id(), id()];
    const encoding = await raw.send([
      ...pbe("SET client_encoding = 'LATIN1'"),
      ...pbe('SET default_transaction_read_only = off'),
      Pn(nm('b'), 'SELECT 1'),
      CLOSE('S', 'x'),
      Pn(nm('a'), 'COMMIT'), // the same statement as nm('b') to the server
      Bn(nm('b')),
      E(),
      ...pbe(`INSERT INTO items VALUES (${n}, 'encoding')`),
      S(),
    ]);
    expect(encoding.errors).not.toEqual([]);
    await raw.send([Q("SET client_encoding = 'UTF8'")]);
    const scs = await raw.send([
      ...pbe('SET standard_conforming_strings = off'),
      ...pbe('SET default_transaction_read_only = off'),
      message('H'),
      Q(`SELECT 'a\\' , ' ; COMMIT; INSERT INTO items SELECT ${m}, $$scs$$; -- '`),
    ]);
    expect(scs.errors).not.toEqual([]);
    raw.close();
    expect(await present(n, m)).toEqual([]);
  });

  test('a group that parses a BEGIN and executes an INSERT first: the fence before the INSERT', async () => {
    const raw = await Raw.connect('begin-parsed-first', '');
    expect((await raw.send([Q('SET default_transaction_read_only = off')])).errors).toEqual([]);
    const n = id();
    const write = await raw.send([P('BEGIN'), P(`INSERT INTO items VALUES (${n}, 'first')`, 'w'), B('w'), E(), S()]);
    expect(write.errors).toEqual(['25006']);
    raw.close();
    expect(await present(n)).toEqual([]);
  });
});

describe('a leader with the current token', () => {
  test('node-postgres: multi-statement queries with COMMIT, CHAIN and BEGIN ISOLATION LEVEL in the middle', async () => {
    const c = await sql.connect('leader', { options: fenceOptions(7, 'leader') });
    const [a, b, d, e] = [id(), id(), id(), id()];
    const results = (await c.query(
      `INSERT INTO items VALUES (${a}, 'a'); COMMIT; BEGIN ISOLATION LEVEL SERIALIZABLE; SHOW transaction_isolation; INSERT INTO items VALUES (${d}, 'd'); COMMIT AND CHAIN; INSERT INTO items VALUES (${e}, 'e'); COMMIT; INSERT INTO items VALUES (${b}, 'b')`,
    )) as unknown as { command: string; rows: unknown[] }[];
    expect(results.map((r) => r.command)).toEqual(['INSERT', 'COMMIT', 'BEGIN', 'SHOW', 'INSERT', 'COMMIT', 'INSERT', 'COMMIT', 'INSERT']);
    expect(results[3]!.rows).toEqual([{ transaction_isolation: 'serializable' }]);
    expect(await present(a, b, d, e)).toEqual([a, b, d, e]);
    expect(await fenceRow(db.pool, 'leader')).toEqual({ highest_token: '7' });
    await c.end();
  });

  test("an error in the writer's statement after an inserted fence reports the position in its own text", async () => {
    const c = await sql.connect('leader-pos', { options: fenceOptions(7, 'leader') });
    const text = 'SELECT 1; COMMIT; SELECT 1 FROM nowhere_at_all';
    const err = (await c.query(text).catch((e: unknown) => e)) as { position?: string };
    expect(err.position).toBe(String(text.indexOf('nowhere_at_all') + 1));
    await c.end();
  });

  test('a pipeline with an Execute of COMMIT between writes commits both, each fenced', async () => {
    const raw = await Raw.connect('leader-raw', fenceOptions(8, 'leader-pipe'));
    const [x, y] = [id(), id()];
    const res = await raw.send([
      ...pbe(`INSERT INTO items VALUES (${x}, 'x')`),
      ...pbe('COMMIT'),
      ...pbe(`INSERT INTO items VALUES (${y}, 'y')`),
      S(),
    ]);
    expect(res).toMatchObject({ errors: [], status: 'I' });
    raw.close();
    expect(await present(x, y)).toEqual([x, y]);
    expect(await fenceRow(db.pool, 'leader-pipe')).toEqual({ highest_token: '8' });
  });

  test('psql: a multi-statement -c with COMMIT in the middle, and a script', async () => {
    const env = { ...process.env, PGOPTIONS: fenceOptions(9, 'leader-psql') };
    const [x, y, z] = [id(), id(), id()];
    const { stdout } = await run(
      PSQL,
      [
        sql.url('psql-leader'),
        '-X',
        '-v',
        'ON_ERROR_STOP=1',
        '-c',
        `INSERT INTO items VALUES (${x}, 'x'); COMMIT; INSERT INTO items VALUES (${y}, 'y')`,
        '-c',
        `BEGIN; INSERT INTO items VALUES (${z}, $$z; COMMIT$$); END`,
      ],
      { env },
    );
    expect(stdout).toContain('COMMIT');
    expect(await present(x, y, z)).toEqual([x, y, z]);
    // The same escape from psql with a stale token.
    await raise('leader-psql', 10);
    const n = id();
    const stale = await run(
      PSQL,
      [
        sql.url('psql-leader'),
        '-X',
        '-v',
        'VERBOSITY=verbose',
        '-c',
        'BEGIN',
        '-c',
        `ROLLBACK; ${LIFT}; INSERT INTO items VALUES (${n}, 'escaped')`,
      ],
      { env },
    ).catch((e: { stderr: string }) => e);
    expect((stale as { stderr: string }).stderr).toContain('FP409');
    expect(await present(n)).toEqual([]);
  });
});
