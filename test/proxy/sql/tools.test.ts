// Postgres's own tools through the SQL endpoint, and what Postgres's statistics views show of an
// endpoint session. Invariant: after startup the endpoint only relays. A tool gets the answers it
// gets straight from Postgres with the same startup settings (`-c fencepost.token=…
// -c fencepost.fence_key=…` are plain custom settings to Postgres; a tokenless endpoint session is a
// session with default_transaction_read_only=on), and nothing the proxy sent shows in
// pg_stat_activity.query (after the writer's first statement), pg_prepared_statements or
// pg_stat_statements but the connection fence's two statements, once per connection at its start.
//
// pg_dump and pg_stat_statements run on Debian's Postgres 15, a cluster of this file's own: Debian's
// pg_dump (15) aborts against the run's Postgres 18 ("server version mismatch"), and the run's
// cluster preloads no library. The rest runs on the run's Postgres.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect } from 'vitest';
import { clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startDebianPostgres, type DebianPostgres } from '../../support/debian-postgres.ts';
import { sqlTest } from '../../support/fixtures.ts';
import { fenceOptions, startSqlProxy, type SqlProxy } from '../../support/sql.ts';

const execFileAsync = promisify(execFile);
const PSQL = '/usr/bin/psql';
const PGBENCH = '/usr/bin/pgbench';
const PG_DUMP = '/usr/bin/pg_dump';
const PG_RESTORE = '/usr/bin/pg_restore';

/** What a tokenless endpoint session is, straight to Postgres. */
const DIRECT_TOKENLESS = '-c default_transaction_read_only=on';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.tool_rows (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);

const dir = mkdtempSync(join(tmpdir(), 'fencepost-tools-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Runs `program` with PGOPTIONS = `options`: its stdout and stderr as one stream, in order, and its exit status. */
async function tool(program: string, args: string[], options: string): Promise<{ output: string; status: number }> {
  const env = { ...process.env, PGOPTIONS: options };
  try {
    const { stdout } = await execFileAsync('/bin/sh', ['-c', 'exec "$0" "$@" 2>&1', program, ...args], { env, maxBuffer: 64 << 20 });
    return { output: stdout, status: 0 };
  } catch (err) {
    const e = err as { stdout?: string; code?: number };
    return { output: e.stdout ?? '', status: e.code ?? -1 };
  }
}

/** psql running `script` with every line echoed (-a), going on after errors: the whole conversation as text. */
async function psqlScript(url: string, options: string, script: string, vars: Record<string, string> = {}) {
  // One file per script: psql names it in its error lines, and runs compare line by line.
  const file = join(dir, `${createHash('sha256').update(script).digest('hex').slice(0, 12)}.sql`);
  writeFileSync(file, script);
  const v = Object.entries(vars).flatMap(([k, val]) => ['-v', `${k}=${val}`]);
  return await tool(PSQL, [url, '-X', '-a', '-v', 'ON_ERROR_STOP=0', ...v, '-f', file], options);
}

describe('psql', () => {
  const SCRIPT = `SHOW work_mem;
SET work_mem = '7MB';
SHOW work_mem;
RESET ALL;
SHOW work_mem;
SHOW default_transaction_read_only;
BEGIN;
SET TRANSACTION ISOLATION LEVEL SERIALIZABLE;
SHOW transaction_isolation;
INSERT INTO public.tool_rows VALUES (:id, 'psql');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY;
SHOW transaction_isolation;
SHOW transaction_read_only;
COMMIT;
SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ;
BEGIN;
SHOW transaction_isolation;
COMMIT;
RESET ALL;
BEGIN;
SHOW transaction_isolation;
SET TRANSACTION ISOLATION LEVEL SERIALIZABLE;
COMMIT;
PREPARE plus_one(int) AS SELECT $1 + 1 AS n;
EXECUTE plus_one(41);
DEALLOCATE plus_one;
`;

  test('SET, SHOW, RESET ALL and isolation levels set after BEGIN: the same conversation as straight to Postgres', async ({ db, sql }) => {
    const options = fenceOptions(1, 'tools/psql');
    const direct = await psqlScript(db.url, options, SCRIPT, { id: '11' });
    expect(direct.output).not.toContain('ERROR');
    expect((await psqlScript(sql.url('psql'), options, SCRIPT, { id: '10' })).output).toBe(direct.output);
    expect((await db.pool.query('SELECT v FROM public.tool_rows WHERE id = 10')).rows).toEqual([{ v: 'psql' }]);
  });

  test('a tokenless session: the same conversation as a read-only session straight to Postgres', async ({ db, sql }) => {
    const direct = await psqlScript(db.url, DIRECT_TOKENLESS, SCRIPT, { id: '21' });
    expect(direct.output).toContain('ERROR:  cannot execute INSERT in a read-only transaction');
    expect((await psqlScript(sql.url('psql-reader'), '', SCRIPT, { id: '20' })).output).toBe(direct.output);
  });
});

describe('VACUUM', () => {
  const SCRIPT = `VACUUM (ANALYZE) public.vacuumed;
VACUUM public.vacuumed;
ANALYZE public.vacuumed;
BEGIN;
VACUUM public.vacuumed;
ROLLBACK;
`;
  const vacuums = async (db: TestDatabase) =>
    Number(
      (
        await db.pool.query<{ n: string }>(
          "SELECT vacuum_count::text AS n FROM pg_stat_user_tables WHERE relid = 'public.vacuumed'::regclass",
        )
      ).rows[0]?.n ?? 0,
    );

  test.beforeAll(async ({ db, sql }) => {
    void sql; // the client login exists once the proxy started
    await db.pool.query('CREATE TABLE public.vacuumed (id int PRIMARY KEY, v text)');
    await db.pool.query(`INSERT INTO public.vacuumed SELECT g, 'row ' || g FROM generate_series(1, 1000) g`);
    // MAINTAIN (Postgres 17+): VACUUM and ANALYZE by a role that does not own the table.
    await db.pool.query(`GRANT SELECT, MAINTAIN ON public.vacuumed TO ${clientRoleFor(db.url)}`);
  });

  for (const tokenless of [false, true]) {
    test(`${tokenless ? 'a tokenless session' : 'with a token'}: VACUUM and ANALYZE run, and VACUUM in a transaction block fails, as straight to Postgres`, async ({
      db,
      sql,
    }) => {
      const options = tokenless ? '' : fenceOptions(1, 'tools/vacuum');
      const before = await vacuums(db);
      const direct = await psqlScript(db.url, tokenless ? DIRECT_TOKENLESS : options, SCRIPT);
      expect(direct.output.match(/ERROR:.*/g)).toEqual(['ERROR:  VACUUM cannot run inside a transaction block']);
      await expect.poll(() => vacuums(db)).toBe(before + 2);
      expect((await psqlScript(sql.url('vacuum'), options, SCRIPT)).output).toBe(direct.output);
      await expect.poll(() => vacuums(db)).toBe(before + 4);
    });
  }
});

describe('pgbench -i', () => {
  interface Initialised {
    rows: Record<string, number>;
    primaryKeys: string[];
    vacuumed: string[];
  }
  /** What `pgbench -i -s 1` left in `schema`: 1 branch, 10 tellers, 100,000 accounts, primary keys, vacuumed tables. */
  async function initialised(db: TestDatabase, schema: string): Promise<Initialised> {
    const rows: Record<string, number> = {};
    for (const t of ['pgbench_branches', 'pgbench_tellers', 'pgbench_accounts', 'pgbench_history'])
      rows[t] = Number((await db.pool.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${schema}.${t}`)).rows[0]!.n);
    const keys = await db.pool.query<{ t: string }>(
      `SELECT c.relname AS t FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
       WHERE k.contype = 'p' AND k.connamespace = $1::regnamespace AND c.relname LIKE 'pgbench\\_%' ORDER BY 1`,
      [schema],
    );
    const vacuumed = await db.pool.query<{ t: string }>(
      `SELECT relname AS t FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE 'pgbench\\_%' AND vacuum_count > 0 ORDER BY 1`,
      [schema],
    );
    return { rows, primaryKeys: keys.rows.map((r) => r.t), vacuumed: vacuumed.rows.map((r) => r.t) };
  }

  test.beforeAll(async ({ db, sql }) => {
    void sql; // the client login exists once the proxy started
    await db.pool.query(`GRANT CREATE ON SCHEMA public TO ${clientRoleFor(db.url)}`);
    await db.pool.query('CREATE SCHEMA pgbench_direct'); // where the same -i runs straight to Postgres
  });

  test('with a token: creates, fills (COPY … FREEZE), vacuums and keys the tables as straight to Postgres; then pgbench runs on them', async ({
    db,
    sql,
  }) => {
    const direct = await tool(PGBENCH, ['-i', '-s', '1', db.url], '-c search_path=pgbench_direct');
    expect(direct.status, direct.output).toBe(0);
    const expected = await initialised(db, 'pgbench_direct');
    expect(expected).toEqual({
      rows: { pgbench_branches: 1, pgbench_tellers: 10, pgbench_accounts: 100_000, pgbench_history: 0 },
      primaryKeys: ['pgbench_accounts', 'pgbench_branches', 'pgbench_tellers'],
      vacuumed: ['pgbench_accounts', 'pgbench_branches', 'pgbench_history', 'pgbench_tellers'],
    });

    const options = fenceOptions(1, 'tools/pgbench');
    const viaEndpoint = await tool(PGBENCH, ['-i', '-s', '1', sql.url('pgbench')], options);
    expect(viaEndpoint.status, viaEndpoint.output).toBe(0);
    expect(await initialised(db, 'public')).toEqual(expected);

    // The built-in TPC-B-like script; without -n, pgbench first vacuums the tables and truncates history.
    const bench = await tool(PGBENCH, ['-c', '2', '-t', '10', sql.url('pgbench')], options);
    expect(bench.status, bench.output).toBe(0);
    expect(bench.output).toContain('number of failed transactions: 0');
    expect((await db.pool.query<{ n: string }>('SELECT count(*)::text AS n FROM public.pgbench_history')).rows[0]!.n).toBe('20');
  }, 120_000);

  test('a tokenless session: refused with the error of a read-only session straight to Postgres', async ({ db, sql }) => {
    const errorLine = (output: string) => output.match(/^.*ERROR:.*$/m)?.[0];
    const direct = await tool(PGBENCH, ['-i', '-s', '1', db.url], `${DIRECT_TOKENLESS} -c search_path=pgbench_direct`);
    expect(direct.status).not.toBe(0);
    expect(errorLine(direct.output)).toContain('cannot execute DROP TABLE in a read-only transaction');
    const viaEndpoint = await tool(PGBENCH, ['-i', '-s', '1', sql.url('pgbench-reader')], '');
    expect(viaEndpoint.status).not.toBe(0);
    expect(errorLine(viaEndpoint.output)).toBe(errorLine(direct.output));
  }, 120_000);
});

describe('pg_stat_activity', () => {
  test("an endpoint session's query column shows its own last statement, and its state Postgres's, after each statement", async ({
    db,
    sql,
  }) => {
    const writer = await sql.connect('activity', { options: fenceOptions(1, 'tools/activity') });
    try {
      const { pid } = (await writer.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!;
      const seen = async () =>
        (await db.pool.query<{ query: string; state: string }>('SELECT query, state FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0];
      expect(await seen()).toEqual({ query: 'SELECT pg_backend_pid() AS pid', state: 'idle' });
      const steps: [pg.QueryConfig, string][] = [
        [{ text: 'BEGIN' }, 'idle in transaction'],
        [{ text: "INSERT INTO public.tool_rows VALUES (30, 'activity')" }, 'idle in transaction'],
        [{ text: 'COMMIT' }, 'idle'],
        [{ text: "SET work_mem = '7MB'" }, 'idle'],
        [{ text: 'SELECT $1::text AS t', values: ['extended'] }, 'idle'],
        [{ name: 'named', text: 'SELECT $1::int + 1 AS n', values: [1] }, 'idle'],
        [{ text: 'START TRANSACTION ISOLATION LEVEL SERIALIZABLE' }, 'idle in transaction'],
        [{ text: 'SELECT count(*) FROM public.tool_rows' }, 'idle in transaction'],
        [{ text: 'ROLLBACK' }, 'idle'],
      ];
      for (const [statement, state] of steps) {
        await writer.query(statement);
        expect(await seen(), statement.text).toEqual({ query: statement.text, state });
      }
    } finally {
      await writer.end();
    }
  });
});

describe('pg_prepared_statements', () => {
  /** Named statements (protocol) and PREPAREd ones (SQL), used around a transaction; the session's list as it sees it. */
  async function prepared(connectionString: string, options: string, id: number) {
    const c = new pg.Client({ connectionString, options: options === '' ? undefined : options });
    c.on('error', () => {});
    await c.connect();
    try {
      await c.query({ name: 'by-id', text: 'SELECT v FROM public.tool_rows WHERE id = $1', values: [id] });
      await c.query('PREPARE add_row(int, text) AS INSERT INTO public.tool_rows VALUES ($1, $2)');
      await c.query('BEGIN');
      await c.query('EXECUTE add_row($1, $2)', [id, 'prepared']).catch(() => {}); // refused in a read-only session
      await c.query('COMMIT');
      await c.query({ name: 'by-id', text: 'SELECT v FROM public.tool_rows WHERE id = $1', values: [id] });
      return (
        await c.query(
          'SELECT name, statement, from_sql, parameter_types::text, generic_plans + custom_plans AS executions FROM pg_prepared_statements ORDER BY name',
        )
      ).rows;
    } finally {
      await c.end();
    }
  }

  test('lists exactly the statements the writer prepared, as straight to Postgres', async ({ db, sql }) => {
    const options = fenceOptions(1, 'tools/prepared');
    const direct = await prepared(db.url, options, 41);
    expect(direct.map((r: { name: string }) => r.name)).toEqual(['add_row', 'by-id']);
    expect(await prepared(sql.url('prepared'), options, 40)).toEqual(direct);
  });

  test('a tokenless session: the same list as a read-only session straight to Postgres', async ({ db, sql }) => {
    const direct = await prepared(db.url, DIRECT_TOKENLESS, 51);
    expect(await prepared(sql.url('prepared-reader'), '', 50)).toEqual(direct);
  });
});

describe("on Debian's Postgres 15", () => {
  let cluster: DebianPostgres;
  let db: TestDatabase;
  let sql: SqlProxy;
  /** The endpoint's client login, and a URL that logs in as it straight to Postgres (trust). */
  let clientRole: string;
  let directAsClient: string;

  beforeAll(async () => {
    cluster = await startDebianPostgres(['-c', 'shared_preload_libraries=pg_stat_statements']);
    db = await cluster.createDatabase('fp_test_tools15');
    // No spare backends here: pg_stat_statements is read per writer's session (a spare's warm-up
    // for the next connect would run during it; the test below counts it apart).
    sql = await startSqlProxy(db, { FENCEPOST_PGWIRE_SPARE_BACKENDS: '0' });
    clientRole = clientRoleFor(db.url);
    const u = new URL(db.url);
    u.username = clientRole;
    directAsClient = u.toString();
    await db.pool.query('CREATE EXTENSION pg_stat_statements');
    await db.pool.query(`CREATE SCHEMA app;
      CREATE TABLE app.items (id serial PRIMARY KEY, name text NOT NULL, added timestamptz NOT NULL DEFAULT '2026-01-01');
      CREATE TABLE app.events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item int REFERENCES app.items, what jsonb);
      CREATE INDEX ON app.events (item);
      CREATE VIEW app.item_names AS SELECT name FROM app.items;
      INSERT INTO app.items (name) SELECT 'item ' || g FROM generate_series(1, 500) g;
      INSERT INTO app.events (item, what) SELECT 1 + g % 500, jsonb_build_object('n', g) FROM generate_series(1, 2000) g;
      CREATE TABLE public.counters (id int PRIMARY KEY, n bigint NOT NULL)`);
    await db.pool.query(`GRANT USAGE ON SCHEMA app TO ${clientRole};
      GRANT SELECT ON ALL TABLES IN SCHEMA app TO ${clientRole};
      GRANT SELECT ON ALL SEQUENCES IN SCHEMA app TO ${clientRole};
      GRANT SELECT, INSERT, UPDATE ON public.counters TO ${clientRole}`);
  }, 120_000);
  afterAll(async () => {
    await sql?.close();
    await cluster?.stop();
  });

  /** A dump's text less psql's \restrict lines, whose key is new on every run. */
  const dumpText = (text: string) => text.replace(/^\\(un)?restrict .*$/gm, '');

  describe('pg_dump', () => {
    for (const tokenless of [false, true]) {
      test(`${tokenless ? 'a tokenless session' : 'with a token'}: the same plain dump as straight to Postgres by the same role`, async () => {
        const options = tokenless ? '' : fenceOptions(1, 'tools/pg-dump');
        const direct = await tool(PG_DUMP, ['--schema=app', directAsClient], tokenless ? DIRECT_TOKENLESS : options);
        expect(direct.status, direct.output).toBe(0);
        expect(direct.output).toContain('COPY app.events');
        const viaEndpoint = await tool(PG_DUMP, ['--schema=app', sql.url('pg-dump')], options);
        expect(viaEndpoint.status, viaEndpoint.output).toBe(0);
        expect(dumpText(viaEndpoint.output)).toBe(dumpText(direct.output));
      });
    }

    test('-Fd -j 2 (workers import the leader snapshot with SET TRANSACTION SNAPSHOT): the same dump as straight to Postgres', async () => {
      const options = fenceOptions(1, 'tools/pg-dump');
      const restored = async (url: string, target: string, pgOptions: string) => {
        const dumped = await tool(PG_DUMP, ['--schema=app', '-Fd', '-j', '2', '-f', join(dir, target), url], pgOptions);
        expect(dumped.status, dumped.output).toBe(0);
        const script = await tool(PG_RESTORE, ['-f', '-', join(dir, target)], '');
        expect(script.status, script.output).toBe(0);
        return dumpText(script.output);
      };
      const direct = await restored(directAsClient, 'direct.dir', options);
      expect(direct).toContain('COPY app.items');
      expect(await restored(sql.url('pg-dump-parallel'), 'endpoint.dir', options)).toBe(direct);
    });
  });

  describe('pg_stat_statements', () => {
    interface Counted {
      query: string;
      calls: number;
      rows: number;
    }
    /** What pg_stat_statements holds for the client login in this database. */
    const statements = async (): Promise<Counted[]> =>
      (
        await db.pool.query<{ query: string; calls: string; rows: string }>(
          `SELECT query, calls::text, rows::text FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND userid = $1::regrole
           ORDER BY query COLLATE "C"`,
          [clientRole],
        )
      ).rows.map((r) => ({ query: r.query, calls: Number(r.calls), rows: Number(r.rows) }));

    /**
     * After a reset, a writer's session: what pg_stat_statements counted for the client login once
     * the session had started (before its first statement), and what it counted after that.
     */
    async function counted(connectionString: string, id: number): Promise<{ atStartup: Counted[]; afterStartup: Counted[] }> {
      await db.pool.query('SELECT pg_stat_statements_reset()');
      const c = new pg.Client({ connectionString, options: fenceOptions(1, 'tools/statements') });
      c.on('error', () => {});
      await c.connect();
      const atStartup = await statements();
      try {
        await c.query('SELECT $1::int + 1 AS n', [41]);
        await c.query('BEGIN');
        await c.query('INSERT INTO public.counters VALUES ($1, 1)', [id]);
        await c.query('UPDATE public.counters SET n = n + 1 WHERE id = $1', [id]);
        await c.query('COMMIT');
        await c.query("SET work_mem = '7MB'");
        await c.query('SHOW work_mem');
        await c.query('RESET ALL');
        for (let i = 0; i < 2; i++) await c.query({ name: 'by-id', text: 'SELECT n FROM public.counters WHERE id = $1', values: [id] });
        await c.query('START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY');
        await c.query('SELECT count(*) FROM app.items');
        await c.query('COMMIT');
      } finally {
        await c.end();
      }
      const before = new Map(atStartup.map((r) => [r.query, r]));
      const afterStartup = (await statements())
        .map((r) => ({
          query: r.query,
          calls: r.calls - (before.get(r.query)?.calls ?? 0),
          rows: r.rows - (before.get(r.query)?.rows ?? 0),
        }))
        .filter((r) => r.calls > 0);
      return { atStartup, afterStartup };
    }

    // The connection fence's own statements run once, before the session is ready (the endpoint
    // sends nothing after them): pg_stat_statements counts them per connection, never per transaction.
    test("counts only the connection fence's own statements at the start of an endpoint session", async () => {
      expect((await counted(directAsClient, 3)).atStartup).toEqual([]);
      const atStartup = (await counted(sql.url('statements'), 4)).atStartup;
      expect(atStartup.map((r) => r.query).sort()).toEqual(
        [
          'SELECT (SELECT pg_catalog.to_char(a.backend_start AT TIME ZONE $1, $2) FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a)',
          'SELECT fencepost_api.fence_session($1, $2, $3)',
          'SET LOCAL ROLE NONE',
          'SET LOCAL synchronous_commit = off',
        ].sort(),
      );
    });

    test("with spare backends, what else is counted is the fence's own statements, run on the spare before a writer has it", async () => {
      const spared = await startSqlProxy(db, { FENCEPOST_PGWIRE_SPARE_BACKENDS: '2' });
      try {
        const direct = await counted(directAsClient, 5);
        const through = await counted(spared.url('statements'), 6);
        const writers = new Set(direct.afterStartup.map((r) => r.query));
        const fences = new Set([
          'SELECT (SELECT pg_catalog.to_char(a.backend_start AT TIME ZONE $1, $2) FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a)',
          'SELECT fencepost_api.fence_session($1, $2, $3)',
          'SELECT fencepost_api.fence_session($1, NULL, NULL)',
          'SET LOCAL ROLE NONE',
          'SET LOCAL synchronous_commit = off',
        ]);
        const others = [...through.atStartup, ...through.afterStartup].map((r) => r.query).filter((q) => !writers.has(q));
        expect(others.filter((q) => !fences.has(q))).toEqual([]);
        expect(through.afterStartup.filter((r) => writers.has(r.query))).toEqual(direct.afterStartup);
      } finally {
        await spared.close();
      }
    });

    test("after startup, counts only the writer's own statements, as the same session straight to Postgres by the same role", async () => {
      const direct = await counted(directAsClient, 2);
      expect(direct.afterStartup.map((r) => r.query)).toContain('UPDATE public.counters SET n = n + $2 WHERE id = $1'); // Postgres 15's normal form
      expect(direct.afterStartup).toHaveLength(11);
      expect((await counted(sql.url('statements'), 1)).afterStartup).toEqual(direct.afterStartup);
    });
  });
});
