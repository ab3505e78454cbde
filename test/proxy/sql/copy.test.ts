// COPY through the SQL endpoint, with psql (node-postgres has no COPY without pg-copy-streams) and
// message by message: the connection is fenced at startup, so a COPY FROM STDIN is relayed as sent
// and writes as the connection's fence allows: a stale token never connects; a raise while a COPY
// or its block is open ends the connection and not one row lands; a session without a token is
// read-only by default and, if it lifts that, a protected table still refuses its COPY (FP403).
// COPY TO STDOUT is a read.
import { describe, expect } from 'vitest';
import { execFile } from 'node:child_process';
import type { TestDatabase } from '../../support/db.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { protectTable } from '../../../src/fence/protect.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { B, E, P, Q, RawClient, S } from './raw-client.ts';

const PSQL = '/usr/bin/psql';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.copied (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
  { definition: 'public.copied_guarded (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);
/** public.copied_guarded is protected by this fence key (once per file: guard()). */
const GUARD_KEY = 'copy/guarded';
let guarding: Promise<unknown> | null = null;
const guard = (db: TestDatabase) => (guarding ??= protectTable(db.pool, 'public.copied_guarded', GUARD_KEY));
const guardedCount = async (db: TestDatabase) =>
  (await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM public.copied_guarded')).rows[0]!.n;

interface PsqlRun {
  exit: number;
  stdout: string;
  stderr: string;
}

/**
 * psql against the endpoint as `user`, with the session's token and fence key in PGOPTIONS (none
 * without `fence`), `input` on its stdin; errors print their SQLSTATE (VERBOSITY=verbose), and
 * command tags print unless `-q`.
 * Resolves with the exit status rather than throwing.
 */
function psql(sql: SqlProxy, user: string, args: string[], opts: { fence?: [number, string]; input?: string } = {}): Promise<PsqlRun> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.PGOPTIONS;
  if (opts.fence !== undefined) env.PGOPTIONS = fenceOptions(...opts.fence);
  return new Promise((resolve) => {
    const child = execFile(
      PSQL,
      [sql.url(user), '-X', '-v', 'VERBOSITY=verbose', ...args],
      { env, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const exit = err === null ? 0 : typeof err.code === 'number' ? err.code : -1;
        resolve({ exit, stdout, stderr });
      },
    );
    child.stdin!.end(opts.input ?? '');
  });
}

/** COPY's text format: one `id<TAB>v` line per row, backslash, tab and newline escaped. */
const ESCAPES: Record<string, string> = { '\\': '\\\\', '\t': '\\t', '\n': '\\n' };
const rowsText = (rows: [number, string][]) => rows.map(([id, v]) => `${id}\t${v.replace(/[\\\t\n]/g, (c) => ESCAPES[c]!)}\n`).join('');
const inRange = async (db: TestDatabase, from: number, to: number) =>
  (
    await db.pool.query<{ id: number; v: string }>('SELECT id, v FROM public.copied WHERE id BETWEEN $1 AND $2 ORDER BY id', [from, to])
  ).rows.map((r) => [r.id, r.v]);
const countInRange = async (db: TestDatabase, from: number, to: number) =>
  (await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM public.copied WHERE id BETWEEN $1 AND $2', [from, to])).rows[0]!.n;
const raiseOverHttp = (sql: SqlProxy, fenceKey: string, token: number) =>
  fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, { method: 'PUT', headers: { 'fencing-token': String(token) } });
/** The fence's counts as GET /v1/fences/:key reports them. */
const countsOf = async (sql: SqlProxy, fenceKey: string) => {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`);
  expect(res.status).toBe(200);
  const { accepted, rejected } = (await res.json()) as { accepted: number; rejected: number };
  return { accepted, rejected };
};
const acceptedOf = async (sql: SqlProxy, fenceKey: string) => (await countsOf(sql, fenceKey)).accepted;

describe('COPY FROM STDIN', () => {
  test('with a current token: the rows land, the fence rises to the token and counts each COPY as one accepted transaction', async ({
    sql,
    db,
  }) => {
    // Invariant: a COPY FROM STDIN of a session with a current token commits all its rows, in one
    // transaction (the fence at the session's token, +1 accepted), in every way psql sends it.
    const fence: [number, string] = [4, 'copy/a'];
    const rows: [number, string][] = [
      [1, 'one'],
      [2, 'two with\ttab'],
      [3, 'three'],
    ];

    // COPY … FROM STDIN in a script on psql's stdin, the data lines right after it.
    const script = await psql(sql, 'copier-a', ['-v', 'ON_ERROR_STOP=1'], {
      fence,
      input: `COPY copied (id, v) FROM STDIN;\n${rowsText(rows)}\\.\nSELECT 'after copy';\n`,
    });
    expect(script).toMatchObject({ exit: 0, stderr: '' });
    expect(script.stdout).toContain('after copy');
    expect(await inRange(db, 1, 3)).toEqual(rows);
    expect(await fenceRow(db.pool, 'copy/a')).toEqual({ highest_token: '4' });
    const afterScript = await acceptedOf(sql, 'copy/a');
    expect(afterScript).toBe(2); // the COPY's transaction and the SELECT's

    // psql's \copy … FROM pstdin (psql reads the file, the endpoint sees COPY … FROM STDIN).
    const meta = await psql(sql, 'copier-a', ['-v', 'ON_ERROR_STOP=1', '-c', '\\copy copied (id, v) FROM pstdin'], {
      fence,
      input: rowsText([
        [11, 'eleven'],
        [12, 'twelve'],
      ]),
    });
    expect(meta).toMatchObject({ exit: 0, stderr: '' });
    expect(await inRange(db, 11, 12)).toEqual([
      [11, 'eleven'],
      [12, 'twelve'],
    ]);
    expect(await acceptedOf(sql, 'copy/a')).toBe(afterScript + 1);

    // A COPY in the middle of a multi-statement Query, in a block.
    const inQuery = await psql(sql, 'copier-a', ['-v', 'ON_ERROR_STOP=1', '-c', 'BEGIN; COPY copied (id, v) FROM STDIN; COMMIT'], {
      fence,
      input: `${rowsText([
        [21, 'twenty-one'],
        [22, 'twenty-two'],
      ])}\\.\n`,
    });
    expect(inQuery).toMatchObject({ exit: 0, stderr: '' });
    expect(await inRange(db, 21, 22)).toEqual([
      [21, 'twenty-one'],
      [22, 'twenty-two'],
    ]);
    expect(await acceptedOf(sql, 'copy/a')).toBe(afterScript + 2);
    expect(await fenceRow(db.pool, 'copy/a')).toEqual({ highest_token: '4' });
  });

  test('a large COPY (100 000 rows, about 2.5 MB of CopyData) arrives whole', async ({ sql, db }) => {
    // Invariant: the endpoint relays every CopyData message of a long COPY, in order, under
    // back-pressure: exactly the rows sent commit, no more, no fewer.
    const n = 100_000;
    const base = 100_000;
    const input = Array.from({ length: n }, (_, i) => `${base + i}\trow ${base + i} ${'x'.repeat(i % 13)}\n`).join('');
    const big = await psql(sql, 'copier-big', ['-v', 'ON_ERROR_STOP=1', '-c', '\\copy copied (id, v) FROM pstdin'], {
      fence: [1, 'copy/big'],
      input,
    });
    expect(big).toMatchObject({ exit: 0, stderr: '' });
    const { rows } = await db.pool.query<{ n: number; s: string; bad: number }>(
      `SELECT count(*)::int AS n, sum(id)::text AS s, count(*) FILTER (WHERE v <> 'row ' || id || ' ' || repeat('x', (id - $1) % 13))::int AS bad FROM public.copied WHERE id BETWEEN $1 AND $2`,
      [base, base + n - 1],
    );
    expect(rows[0]).toEqual({ n, s: String((n * (2 * base + n - 1)) / 2), bad: 0 });
  });

  test('a COPY that fails part-way commits none of its rows, and the session goes on', async ({ sql, db }) => {
    // Invariant: a COPY the database refuses in the middle (a duplicate key in row 30 000 of
    // 60 000, while the writer is still sending) commits nothing of itself; the endpoint stays in
    // step with the backend, so the same session's next COPY and statement run and commit.
    const fence: [number, string] = [1, 'copy/fail'];
    const base = 600_000;
    const bad = Array.from({ length: 60_000 }, (_, i) => `${base + (i === 30_000 ? 0 : i)}\tbad copy\n`).join('');
    const good = rowsText([
      [base + 70_000, 'good'],
      [base + 70_001, 'good'],
    ]);
    const script = `COPY copied (id, v) FROM STDIN;\n${bad}\\.\nCOPY copied (id, v) FROM STDIN;\n${good}\\.\nSELECT count(*) AS n FROM copied WHERE id >= ${base};\n`;
    const run = await psql(sql, 'failing-copier', ['-A', '-t'], { fence, input: script }); // no ON_ERROR_STOP: going on
    expect(run.stderr).toContain('23505');
    expect(run.stdout.trim().split('\n')).toEqual(['COPY 2', '2']);
    expect(await inRange(db, base, base + 99_999)).toEqual([
      [base + 70_000, 'good'],
      [base + 70_001, 'good'],
    ]);
    expect(await fenceRow(db.pool, 'copy/fail')).toEqual({ highest_token: '1' });
  });

  test('with a stale token: refused at connect (psql shows the FATAL), not one row, the fence where the new leader put it, each refusal counted', async ({
    sql,
    db,
  }) => {
    // Invariant: once the fence is above a token, no connection with it is made, so no COPY of it
    // writes and the fence does not move.
    const fence: [number, string] = [5, 'copy/b'];
    const first = await psql(sql, 'old-copier', ['-v', 'ON_ERROR_STOP=1', '-c', '\\copy copied (id, v) FROM pstdin'], {
      fence,
      input: rowsText([[200, 'leader 5']]),
    });
    expect(first).toMatchObject({ exit: 0, stderr: '' });
    expect((await raiseOverHttp(sql, 'copy/b', 6)).status).toBe(200);
    const raised = await countsOf(sql, 'copy/b'); // the COPY and the raise, accepted
    expect(raised).toEqual({ accepted: 2, rejected: 0 });

    const script = await psql(sql, 'old-copier', ['-v', 'ON_ERROR_STOP=1'], {
      fence,
      input: `COPY copied (id, v) FROM STDIN;\n${rowsText([
        [201, 'zombie'],
        [202, 'zombie'],
        [203, 'zombie'],
      ])}\\.\n`,
    });
    expect(script.exit).not.toBe(0);
    // libpq shows a connection failure's message, not its SQLSTATE.
    expect(script.stderr).toContain('FATAL:  stale fencing token: token 5 is below the highest token 6 of fence key "copy/b"');

    const meta = await psql(sql, 'old-copier', ['-v', 'ON_ERROR_STOP=1', '-c', '\\copy copied (id, v) FROM pstdin'], {
      fence,
      input: rowsText([
        [204, 'zombie'],
        [205, 'zombie'],
      ]),
    });
    expect(meta.exit).not.toBe(0);
    expect(meta.stderr).toContain('stale fencing token');

    expect(await inRange(db, 200, 299)).toEqual([[200, 'leader 5']]);
    expect(await fenceRow(db.pool, 'copy/b')).toEqual({ highest_token: '6' });
    // Each refused connection is counted as rejected (recorded after the refusal), none as accepted.
    await expect.poll(() => countsOf(sql, 'copy/b')).toEqual({ accepted: 2, rejected: 2 });
  });

  test('a raise while a COPY is in progress, or while its block is open: the writer is answered FP409, the connection closes, not one row lands', async ({
    sql,
    db,
  }) => {
    // Invariant: a newer leader's raise ends the connection (after waiting a while for the
    // transaction it found open) before it commits, so nothing the old connection copied lands,
    // whether its COPY was still reading data or done and waiting for COMMIT.
    const key = 'copy/d';
    const copyData = (text: string) => message('d', Buffer.from(text));
    // A current token with the same statements commits (so the failure is the raise's).
    const current = await psql(
      sql,
      'tx-copier',
      ['-v', 'ON_ERROR_STOP=1', '-c', 'BEGIN', '-c', '\\copy copied (id, v) FROM pstdin', '-c', 'COMMIT'],
      {
        fence: [7, key],
        input: rowsText([
          [300, 'in tx'],
          [301, 'in tx'],
          [302, 'in tx'],
        ]),
      },
    );
    expect(current).toMatchObject({ exit: 0, stderr: '' });
    expect(await countInRange(db, 300, 302)).toBe(3);

    // Mid-COPY: the Query is in flight (its data partly sent) when the raise ends the connection.
    const copying = await RawClient.connect(sql.port, sql.database, 'mid-copier', fenceOptions(7, key));
    try {
      copying.write(Q('COPY copied (id, v) FROM STDIN'), copyData('310\tmid copy\n311\tmid copy\n'));
      expect((await raiseOverHttp(sql, key, 8)).status).toBe(200);
      copying.write(copyData('312\tafter the raise\n'), message('c'));
      const out = await copying.read(1);
      expect(out.errors).toEqual(['FP409']);
      expect(out.tags).not.toContain('COPY 3');
      expect(out.closed || (await copying.read(1)).closed).toBe(true);
    } finally {
      copying.close();
    }

    // Done copying, the block open: its COMMIT is answered FP409.
    const inBlock = await RawClient.connect(sql.port, sql.database, 'block-copier', fenceOptions(8, key));
    try {
      expect(await inBlock.send([Q('BEGIN')], 1)).toMatchObject({ errors: [], status: 'T' });
      inBlock.write(Q('COPY copied (id, v) FROM STDIN'));
      expect(await inBlock.send([copyData('320\tin block\n321\tin block\n'), message('c')], 1)).toMatchObject({
        errors: [],
        tags: ['COPY 2'],
        status: 'T',
      });
      expect((await raiseOverHttp(sql, key, 9)).status).toBe(200);
      const commit = await inBlock.send([Q('COMMIT')], 1);
      expect(commit.errors).toEqual(['FP409']);
      expect(commit.tags).not.toContain('COMMIT');
      expect((await inBlock.read(1)).closed).toBe(true);
    } finally {
      inBlock.close();
    }

    expect(await countInRange(db, 303, 399)).toBe(0);
    expect(await fenceRow(db.pool, key)).toEqual({ highest_token: '9' });
  });

  test('a session without a token: 25006 by default; once it lifts read-only it copies into an unprotected table as straight to Postgres, and a protected table refuses it with FP403', async ({
    sql,
    db,
  }) => {
    // Invariant: a session without a token (or fenced for another key) never writes a protected
    // table, whatever it sets; its read-only default is a convenience, not the fence.
    await guard(db);
    const script = await psql(sql, 'no-token', ['-v', 'ON_ERROR_STOP=1'], {
      input: `COPY copied (id, v) FROM STDIN;\n${rowsText([
        [400, 'no token'],
        [401, 'no token'],
      ])}\\.\n`,
    });
    expect(script.exit).not.toBe(0);
    expect(script.stderr).toContain('25006');

    const meta = await psql(sql, 'no-token', ['-v', 'ON_ERROR_STOP=1', '-c', '\\copy copied (id, v) FROM pstdin'], {
      input: rowsText([[402, 'no token']]),
    });
    expect(meta.exit).not.toBe(0);
    expect(meta.stderr).toContain('25006');
    expect(await countInRange(db, 400, 402)).toBe(0);

    const lift = ['-c', 'SET default_transaction_read_only = off', '-c', 'BEGIN READ WRITE'];
    const lifted = await psql(
      sql,
      'no-token',
      ['-v', 'ON_ERROR_STOP=1', ...lift, '-c', '\\copy copied (id, v) FROM pstdin', '-c', 'COMMIT'],
      {
        input: rowsText([[403, 'no token, lifted']]),
      },
    );
    expect(lifted).toMatchObject({ exit: 0, stderr: '' });
    expect(await inRange(db, 403, 403)).toEqual([[403, 'no token, lifted']]);

    for (const fence of [undefined, [1, 'copy/other'] as [number, string]]) {
      const guarded = await psql(
        sql,
        'no-token',
        ['-v', 'ON_ERROR_STOP=1', ...lift, '-c', '\\copy copied_guarded (id, v) FROM pstdin', '-c', 'COMMIT'],
        { input: rowsText([[404, 'not its fence']]), ...(fence ? { fence } : {}) },
      );
      expect(guarded.exit).not.toBe(0);
      expect(guarded.stderr).toContain('FP403');
    }
    expect(await guardedCount(db)).toBe(0);
  });
});

describe('COPY TO STDOUT', () => {
  const expected = '500\tfive hundred\n501\t\\N\n502\twith\\ttab\n';
  // sql: the proxy is up, so the table exists.
  test.beforeAll(async ({ db, sql: _up }) => {
    await db.pool.query("INSERT INTO public.copied VALUES (500, 'five hundred'), (501, NULL), (502, E'with\\ttab')");
  });

  test('in a session with a token: the rows, in COPY text format; each read is counted as an accepted transaction of its fence', async ({
    sql,
    db,
  }) => {
    // Invariant: COPY out through the endpoint returns exactly what COPY returns from Postgres
    // (every CopyData relayed, nothing added).
    const fence: [number, string] = [2, 'copy/c'];
    const out = await psql(
      sql,
      'reader-with-token',
      ['-v', 'ON_ERROR_STOP=1', '-c', 'COPY (SELECT id, v FROM copied WHERE id BETWEEN 500 AND 599 ORDER BY id) TO STDOUT'],
      { fence },
    );
    expect(out).toEqual({ exit: 0, stdout: expected, stderr: '' });
    const meta = await psql(
      sql,
      'reader-with-token',
      [
        '-v',
        'ON_ERROR_STOP=1',
        '-c',
        '\\copy (SELECT id, v FROM copied WHERE id BETWEEN 500 AND 599 ORDER BY id) TO pstdout WITH (FORMAT csv, HEADER)',
      ],
      { fence },
    );
    expect(meta).toEqual({ exit: 0, stdout: 'id,v\n500,five hundred\n501,\n502,with\ttab\n', stderr: '' });
    expect(await fenceRow(db.pool, 'copy/c')).toEqual({ highest_token: '2' });
    expect(await acceptedOf(sql, 'copy/c')).toBe(2);
  });

  test('in a session without a token (read-only): the same rows', async ({ sql }) => {
    // Invariant: a session without a token reads, COPY out included, and gets the same bytes.
    const out = await psql(sql, 'reader', [
      '-v',
      'ON_ERROR_STOP=1',
      '-c',
      'COPY (SELECT id, v FROM copied WHERE id BETWEEN 500 AND 599 ORDER BY id) TO STDOUT',
    ]);
    expect(out).toEqual({ exit: 0, stdout: expected, stderr: '' });
  });

  test('a large COPY out (100 000 rows) arrives whole, with and without a token', async ({ sql }) => {
    // Invariant: the endpoint relays every CopyData of a long COPY out under back-pressure, each
    // byte as Postgres sent it (the backend's reads go into slices of a slab: none written over).
    const query = "COPY (SELECT g, 'line ' || g FROM generate_series(1, 100000) g) TO STDOUT";
    for (const fence of [[3, 'copy/big-out'] as [number, string], undefined]) {
      const out = await psql(sql, 'big-reader', ['-v', 'ON_ERROR_STOP=1', '-c', query], { fence });
      expect(out.exit).toBe(0);
      const lines = out.stdout.split('\n');
      expect(lines.length).toBe(100_001); // and the empty string after the last newline
      expect(lines.slice(0, 100_000).findIndex((line, i) => line !== `${i + 1}\tline ${i + 1}`)).toBe(-1);
      expect(lines[100_000]).toBe('');
    }
  });
});

describe('COPY FROM STDIN, message by message', () => {
  const copyData = (text: string) => message('d', Buffer.from(text));
  const COPY_DONE = message('c');

  test('over the extended protocol as libpq sends it (Parse/Bind/Execute/Sync, the data, CopyDone, Sync): the rows land, fenced', async ({
    sql,
    db,
  }) => {
    // Invariant: the backend ignores a Sync during COPY IN; the one after CopyDone answers the
    // group. The endpoint neither waits for an answer that cannot come nor adds one.
    const raw = await RawClient.connect(sql.port, sql.database, 'copier-ext', fenceOptions(6, 'copy/ext'));
    try {
      raw.write(P('COPY copied (id, v) FROM STDIN'), B(), E(), S());
      await new Promise((r) => setTimeout(r, 100)); // the backend is in COPY IN now
      const done = await raw.send([copyData('31\tthirty-one\n32\tthirty-two\n'), COPY_DONE, S()], 1);
      expect(done.errors).toEqual([]);
      expect(done.tags).toContain('COPY 2');
      expect(done.status).toBe('I');
      expect(await inRange(db, 31, 32)).toEqual([
        [31, 'thirty-one'],
        [32, 'thirty-two'],
      ]);
      expect(await fenceRow(db.pool, 'copy/ext')).toEqual({ highest_token: '6' });
      // The whole exchange in one write (a pipeline), and a COPY whose data the backend refuses.
      const piped = await raw.send([P('COPY copied (id, v) FROM STDIN'), B(), E(), S(), copyData('33\tthirty-three\n'), COPY_DONE, S()], 1);
      expect(piped).toMatchObject({ errors: [], status: 'I' });
      expect(piped.tags).toContain('COPY 1');
      raw.write(P('COPY copied (id, v) FROM STDIN'), B(), E(), S());
      await new Promise((r) => setTimeout(r, 100));
      const refused = await raw.send([copyData('not a number\tx\n'), COPY_DONE, S()], 1);
      expect(refused).toMatchObject({ errors: ['22P02'], status: 'I' });
      expect(await inRange(db, 31, 34)).toEqual([
        [31, 'thirty-one'],
        [32, 'thirty-two'],
        [33, 'thirty-three'],
      ]);
      // The session goes on.
      expect((await raw.send([Q('SELECT 1')], 1)).tags).toEqual(['SELECT 1']);
    } finally {
      raw.close();
    }
  });

  test('with a current token, the whole exchange in one write (CopyDone and Sync behind the Execute, no Sync before the data) and more Syncs and Queries behind it: one answer each', async ({
    sql,
    db,
  }) => {
    // Invariant: every Sync and Query of the writer's gets exactly one ReadyForQuery, and nothing of
    // the proxy's reaches the writer.
    const raw = await RawClient.connect(sql.port, sql.database, 'copier-piped', fenceOptions(6, 'copy/ext'));
    try {
      const piped = await raw.send(
        [P('COPY copied (id, v) FROM STDIN'), B(), E(), copyData('61\tsixty-one\n62\tsixty-two\n'), COPY_DONE, S()],
        1,
      );
      expect(piped).toMatchObject({ errors: [], tags: ['COPY 2'], status: 'I' });
      expect(piped.frames.map((f) => f.type).join('')).toBe('12GCZ');
      const more = await raw.send(
        [
          ...[P('COPY copied (id, v) FROM STDIN'), B(), E(), copyData('63\tsixty-three\n'), COPY_DONE, S()],
          S(),
          Q('SELECT count(*) FROM copied WHERE id BETWEEN 61 AND 69'),
          S(),
          ...[P('COPY copied (id, v) FROM STDIN'), B(), E(), S(), copyData('64\tsixty-four\n'), COPY_DONE, S()],
          Q('SELECT 1'),
        ],
        6,
      );
      expect(more).toMatchObject({ errors: [], tags: ['COPY 1', 'SELECT 1', 'COPY 1', 'SELECT 1'], status: 'I', closed: false });
      expect(more.rows).toEqual([['3'], ['1']]);
      expect(more.frames.filter((f) => f.type === 'Z')).toHaveLength(6);
      // Nothing more comes: the next Query's answer is its own.
      expect(await raw.send([Q('SELECT 2')], 1)).toMatchObject({ tags: ['SELECT 1'], rows: [['2']], status: 'I' });
      expect(await countInRange(db, 61, 69)).toBe(4);
      expect(await fenceRow(db.pool, 'copy/ext')).toEqual({ highest_token: '6' });
    } finally {
      raw.close();
    }
  });

  test('a tokenless session, read-only lifted: the Syncs around a failed COPY get the answers Postgres gives them, and the protected write behind them is refused FP403', async ({
    sql,
    db,
  }) => {
    // Invariant: no row lands in a protected table from a session that passed no fence, however
    // its messages are cut and pipelined; the endpoint adds no answer and drops none, so the
    // writer's count of ReadyForQuery messages is Postgres's. (Found by a red team against the
    // per-transaction fence: after Parse/Bind/Execute of a COPY with its data, CopyDone and Sync in
    // one write, the data refused in a block, the proxy took a later Sync's ReadyForQuery for the
    // ROLLBACK's and sent the INSERT behind it unfenced. The backend also answers a Sync sent inside
    // the copy stream when it ended the copy with an error before reading it.)
    await guard(db);
    const BOOM = `CREATE FUNCTION pg_temp.boom() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'boom'; END$$`;
    const shapes: { name: string; trigger?: boolean; first?: Buffer[]; copy: Buffer[] }[] = [
      { name: 'pipelined', copy: [P('COPY scratch FROM STDIN'), B(), E(), copyData('not-a-number\n'), COPY_DONE, S(), S()] },
      { name: 'sync-in-data', copy: [P('COPY scratch FROM STDIN'), B(), E(), copyData('not-a-number\n'), S(), COPY_DONE, S()] },
      { name: 'query-sync-in-data', first: [Q('COPY scratch FROM STDIN')], copy: [copyData('not-a-number\n'), S(), COPY_DONE] },
      { name: 'trigger', trigger: true, first: [P('COPY scratch FROM STDIN'), B(), E(), S()], copy: [COPY_DONE, S()] },
      { name: 'trigger-pipelined', trigger: true, copy: [P('COPY scratch FROM STDIN'), B(), E(), S(), COPY_DONE, S()] },
    ];
    for (const [n, shape] of shapes.entries()) {
      const id = 70 + n;
      const raw = await RawClient.connect(sql.port, sql.database, 'copier-tokenless');
      try {
        // Read-only lifted, as a writer may; a temporary table to COPY into.
        const setup = [Q('SET default_transaction_read_only = off'), Q('CREATE TEMP TABLE scratch (id int)')];
        if (shape.trigger)
          setup.push(Q(BOOM), Q('CREATE TRIGGER boom BEFORE INSERT ON scratch FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.boom()'));
        expect((await raw.send(setup, setup.length)).errors).toEqual([]);
        expect(await raw.send([Q('BEGIN; SELECT 1')], 1)).toMatchObject({ errors: [], status: 'T' });
        if (shape.first !== undefined) {
          raw.write(...shape.first);
          await new Promise((r) => setTimeout(r, 100)); // the backend is in COPY IN (or failed it)
        }
        // The ROLLBACK slow enough that its answer comes in a read of its own, then a write.
        raw.write(...shape.copy, Q('ROLLBACK; SELECT pg_sleep(0.3)'), Q(`INSERT INTO copied_guarded VALUES (${id}, 'tokenless'); COMMIT`));
        // Four ReadyForQuery messages, as Postgres answers: two for the Syncs (or the COPY's Query
        // and a Sync it read after the error), one for each Query.
        const out = await raw.read(4);
        expect(out, shape.name).toMatchObject({ status: 'I', closed: false });
        expect(out.tags, shape.name).not.toContain('INSERT 0 1');
        expect(out.tags, shape.name).toContain('ROLLBACK');
        expect(out.errors.at(-1), shape.name).toBe('FP403');
        // Postgres's answers only: pg_sleep's one row.
        expect(out.rows.flat(), shape.name).toEqual(['']);
      } finally {
        raw.close();
      }
    }
    expect(await guardedCount(db)).toBe(0);
  });

  test("a message other than copy data, Flush or Sync inside a COPY IN: Postgres's 08P01 reaches the writer and the session ends (no hang), nothing of the COPY lands", async ({
    sql,
    db,
  }) => {
    // Found by the protocol fuzzer against the per-transaction fence: an Execute after COPY … FROM
    // STDIN waited for the Query's ReadyForQuery while the backend waited for the end of the copy
    // data behind it. Relayed as sent, Postgres answers it itself.
    const raw = await RawClient.connect(sql.port, sql.database, 'copier-bad', fenceOptions(6, 'copy/ext'));
    raw.write(Q('COPY copied (id, v) FROM STDIN'), copyData('41\tforty-one\n'));
    await new Promise((r) => setTimeout(r, 100));
    const out = await raw.send([E(), copyData('42\tforty-two\n'), message('f', 'given up'), S(), Q('SELECT 1')], 2);
    expect(out.closed).toBe(true);
    expect(out.errors).toContain('08P01');
    expect(await countInRange(db, 41, 42)).toBe(0);
  });

  test("a Terminate inside a COPY IN (the writer quits mid-copy) closes the session: only Postgres's own answer is relayed, nothing of the COPY lands", async ({
    sql,
    db,
  }) => {
    // psycopg closing a connection with a copy open: the writer leaves, the copy rolls back. The
    // Terminate reaches Postgres as sent, which answers it as a message out of place in a COPY
    // (08P01); the endpoint adds nothing of its own.
    const raw = await RawClient.connect(sql.port, sql.database, 'copier-quit', fenceOptions(6, 'copy/ext'));
    raw.write(Q('COPY copied (id, v) FROM STDIN'), copyData('51\tfifty-one\n'));
    await new Promise((r) => setTimeout(r, 100));
    const out = await raw.send([message('X')], 1);
    expect(out.closed).toBe(true);
    expect(out.errors.every((c) => c === '08P01')).toBe(true);
    expect(await countInRange(db, 51, 51)).toBe(0);
  });
});
