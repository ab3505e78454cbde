// Protected data, enforced by Postgres: a protected table takes writes only from a transaction that
// passed its fence key's fence, whichever door, protocol or statement kind the write comes by, and
// straight to Postgres not at all. Invariant of every refusal here: the table holds nothing it did
// not hold before (read in Postgres, by the owner).
import { describe, expect } from 'vitest';
import { spawnSync } from 'node:child_process';
import pg from 'pg';
import { sqlTest } from '../support/fixtures.ts';
import { fenceOptions, fenceRow } from '../support/sql.ts';
import { clientRoleFor, type TestDatabase } from '../support/db.ts';
import { BACKEND_START_SQL, sessionFenceCapability } from '../../src/fence/sql/rule.ts';
import { listProtected, protectTable, unprotectTable } from '../../src/fence/protect.ts';
import { BIN } from '../support/proxy.ts';
import { ProtectError } from '../../src/fence/errors.ts';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.orders (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE' },
  { definition: 'public.notes (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT, UPDATE, DELETE' },
]);

const FENCE = 'orders/main';
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
const count = async (db: TestDatabase) =>
  Number((await db.pool.query<{ n: string }>('SELECT count(*) AS n FROM public.orders')).rows[0]!.n);
const ids = { next: 1 };
const id = () => ids.next++;

/** A connection straight to Postgres on the open mode's client login (the proxy made it). */
async function clientLogin(db: TestDatabase): Promise<pg.Client> {
  const login = clientRoleFor(db.url);
  const password = (await db.pool.query<{ password: string }>('SELECT password FROM fencepost.client_logins WHERE login = $1', [login]))
    .rows[0]!.password;
  const url = new URL(db.url);
  url.username = login;
  url.password = password;
  const c = new pg.Client({ connectionString: url.toString() });
  await c.connect();
  return c;
}

async function setup(db: TestDatabase): Promise<void> {
  if ((await listProtected(db.pool)).some((p) => p.target === 'orders')) return;
  await protectTable(db.pool, 'public.orders', FENCE);
  await db.pool.query(`INSERT INTO fencepost.fences (fence_key, highest_token) VALUES ($1, 6) ON CONFLICT DO NOTHING`, [FENCE]);
}

describe('a protected table', () => {
  test('is declared in the database with its trigger enforced', async ({ db, sql }) => {
    void sql;
    await setup(db);
    expect(await listProtected(db.pool)).toContainEqual({ kind: 'table', target: 'orders', fenceKey: FENCE, enforced: true, whyNot: null });
  });

  test('refuses every kind of write straight to Postgres, even by its owner: INSERT, UPDATE, DELETE, TRUNCATE, COPY, MERGE, a view', async ({
    db,
    sql,
  }) => {
    void sql;
    await setup(db);
    const before = await count(db);
    await db.pool.query('CREATE OR REPLACE VIEW public.orders_view AS SELECT * FROM public.orders');
    const attempts = [
      `INSERT INTO public.orders VALUES (${id()}, 'direct')`,
      `UPDATE public.orders SET v = 'x'`,
      `DELETE FROM public.orders`,
      `TRUNCATE public.orders`,
      `MERGE INTO public.orders o USING (SELECT ${id()} AS id) s ON o.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'merge')`,
      `INSERT INTO public.orders_view VALUES (${id()}, 'view')`,
      `BEGIN READ WRITE; SELECT set_config('fencepost.fenced', repeat('a', 64), true); INSERT INTO public.orders VALUES (${id()}, 'forged'); COMMIT`,
    ];
    for (const sqlText of attempts) expect(await code(db.pool.query(sqlText)), sqlText).toBe('FP403');
    // COPY FROM (psql's \copy sends COPY … FROM STDIN) fires the INSERT statement trigger.
    const copy = spawnSync('psql', [db.url, '-v', 'ON_ERROR_STOP=1', '-c', 'COPY public.orders FROM STDIN'], {
      input: `${id()}\tcopy\n\\.\n`,
      encoding: 'utf8',
    });
    expect(copy.status).not.toBe(0);
    expect(copy.stderr).toMatch(/did not pass the fence/);
    expect(await count(db)).toBe(before);
  });

  test('refuses a write on the client login straight to Postgres, with the hint naming the fence key', async ({ db, sql }) => {
    void sql;
    await setup(db);
    const c = await clientLogin(db);
    const err = await c.query(`INSERT INTO public.orders VALUES (${id()}, 'bypass')`).catch((e: pg.DatabaseError) => e);
    expect((err as pg.DatabaseError).code).toBe('FP403');
    expect((err as pg.DatabaseError).hint).toContain(JSON.stringify(FENCE));
    await c.end();
  });

  test("takes writes from an SQL-endpoint session at the fence's token, in the simple and the extended protocol", async ({ db, sql }) => {
    await setup(db);
    const c = await sql.connect('leader', { options: fenceOptions(6, FENCE) });
    const before = await count(db);
    await c.query(`INSERT INTO public.orders VALUES (${id()}, 'simple')`);
    await c.query('INSERT INTO public.orders VALUES ($1, $2)', [id(), 'extended']);
    await c.query('BEGIN');
    await c.query(`UPDATE public.orders SET v = v`);
    await c.query('COMMIT');
    expect(await count(db)).toBe(before + 2);
    await c.end();
  });

  test('refuses a session without a token even in a transaction it made read-write itself', async ({ db, sql }) => {
    await setup(db);
    const c = await sql.connect('tokenless');
    const before = await count(db);
    await c.query('BEGIN READ WRITE').catch(() => {});
    const state = await code(c.query(`INSERT INTO public.orders VALUES (${id()}, 'tokenless')`));
    expect(['FP403', '25006']).toContain(state);
    await c.query('ROLLBACK');
    await c.query('SET default_transaction_read_only = off').catch(() => {});
    expect(['FP403', '25006']).toContain(await code(c.query(`INSERT INTO public.orders VALUES (${id()}, 'tokenless')`)));
    expect(await count(db)).toBe(before);
    await c.end();
  });

  test('refuses a session fenced by another fence key, and a stale one', async ({ db, sql }) => {
    await setup(db);
    const before = await count(db);
    const other = await sql.connect('other-key', { options: fenceOptions(1, 'notes/main') });
    expect(await code(other.query(`INSERT INTO public.orders VALUES (${id()}, 'other fence')`))).toBe('FP403');
    await other.query(`INSERT INTO public.notes VALUES (${id()}, 'unprotected table')`); // the session itself works
    await other.end();
    // A stale token is refused at connect: it never gets a session to write with.
    expect(await code(sql.connect('stale', { options: fenceOptions(5, FENCE) }))).toBe('FP409');
    expect(await count(db)).toBe(before);
    expect(await fenceRow(db.pool, FENCE)).toEqual({ highest_token: '6' });
  });

  test('refuses PREPARE TRANSACTION in a fenced transaction on the SQL endpoint', async ({ db, sql }) => {
    await setup(db);
    const c = await sql.connect('preparer', { options: fenceOptions(6, FENCE) });
    await c.query('BEGIN');
    await c.query(`INSERT INTO public.orders VALUES (${id()}, 'to prepare')`);
    // The test Postgres allows prepared transactions (global-setup.ts): the fence's temporary table refuses it.
    const err = await c.query(`PREPARE TRANSACTION 'fp-x'`).catch((e: pg.DatabaseError) => e);
    expect((err as pg.DatabaseError).code).toBe('0A000');
    await c.query('ROLLBACK').catch(() => {});
    expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE database = current_database()')).rowCount).toBe(0);
    await c.end();
  });

  test("a writer's temporary object in place of the fence's own sequence fails the protected write; it is never queried as the fence's owner", async ({
    db,
    sql,
  }) => {
    void sql;
    await setup(db);
    // The session fenced straight to Postgres on the client login, with the capability the proxy
    // would compute for that backend; the protected table's trigger reads the temporary sequence.
    const c = await clientLogin(db);
    // The backend's start read as session_start() reads it, without making the temporary sequence.
    const backend = (await c.query<{ pid: number; start: string }>(`SELECT pg_backend_pid() AS pid, ${BACKEND_START_SQL} AS start`))
      .rows[0]!;
    const secret = (await db.pool.query<{ secret: string }>('SELECT secret FROM fencepost.fence_capability')).rows[0]!.secret;
    // Each would run pg_temp.who() as the fence's owner if it were queried: a view, a table with a
    // policy. A sequence of the writer's runs no code: read or refused, PREPARE stays refused.
    await c.query(
      `CREATE FUNCTION pg_temp.who() RETURNS text LANGUAGE sql AS $$ SELECT set_config('fp.test.ran_as', current_user, false) $$`,
    );
    const fence = async () => {
      await c.query('SELECT fencepost_api.fence_session($1, $2, 6)', [sessionFenceCapability(secret, backend, FENCE, 6n), FENCE]);
      return c.query(`INSERT INTO public.orders VALUES (${id()}, 'squatted')`);
    };
    const squatters: [string, string][] = [
      ['CREATE TEMPORARY VIEW fencepost_no_prepare_seq AS SELECT pg_temp.who() AS who', '42809'],
      [
        `CREATE TEMPORARY TABLE fencepost_no_prepare_seq (who text); ALTER TABLE fencepost_no_prepare_seq ENABLE ROW LEVEL SECURITY;
        CREATE POLICY p ON fencepost_no_prepare_seq USING (pg_temp.who() IS NOT NULL); GRANT ALL ON fencepost_no_prepare_seq TO PUBLIC`,
        '42809',
      ],
    ];
    for (const [squat, expected] of squatters) {
      await c.query('BEGIN');
      await c.query(squat);
      expect(await code(fence())).toBe(expected);
      await c.query('ROLLBACK');
    }
    await c.query('BEGIN; CREATE TEMPORARY SEQUENCE fencepost_no_prepare_seq');
    const read = await code(fence());
    expect(['ok', '42501']).toContain(read); // the owner reads it if it may (a superuser may)
    if (read === 'ok') expect(await code(c.query(`PREPARE TRANSACTION 'fp-squat'`))).toBe('0A000');
    await c.query('ROLLBACK');
    expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE database = current_database()')).rowCount).toBe(0);
    expect((await c.query(`SELECT current_setting('fp.test.ran_as', true) AS who`)).rows[0]!.who ?? '').toBe('');
    await c.end();
  });

  test('through POST /v1/transactions: writes with the fence key among its fences, refused with 403 not_fenced without', async ({
    db,
    sql,
  }) => {
    await setup(db);
    const before = await count(db);
    const post = (fences: { key: string; token: string }[], stmt: string) =>
      fetch(`${sql.proxy.url}/v1/transactions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ fences, statements: [{ sql: stmt }] }),
      });
    const ok = await post([{ key: FENCE, token: '6' }], `INSERT INTO public.orders VALUES (${id()}, 'tx')`);
    expect(ok.status, await ok.clone().text()).toBe(200);
    const refused = await post([{ key: 'elsewhere', token: '1' }], `INSERT INTO public.orders VALUES (${id()}, 'tx other')`);
    expect(refused.status).toBe(403);
    expect(await refused.json()).toMatchObject({ error: 'not_fenced', sqlState: 'FP403', statement: 0 });
    expect(await count(db)).toBe(before + 1);
    // A statement that prepares the transaction however it is spelt: refused by the fence's temporary table.
    const prepared = await post([{ key: FENCE, token: '6' }], `;PREPARE TRANSACTION 'fp-y'`);
    expect(prepared.status).toBe(400);
    expect(await prepared.json()).toMatchObject({ error: 'sql_error', sqlState: '0A000' });
    expect((await db.pool.query('SELECT gid FROM pg_prepared_xacts WHERE database = current_database()')).rowCount).toBe(0);
  });

  test('is taken off with unprotect; a view or a fencepost table cannot be protected', async ({ db, sql }) => {
    void sql;
    await db.pool.query('CREATE TABLE IF NOT EXISTS public.scratch (id int)');
    await protectTable(db.pool, 'public.scratch', 'scratch');
    expect(await code(db.pool.query('INSERT INTO public.scratch VALUES (1)'))).toBe('FP403');
    expect(await unprotectTable(db.pool, 'public.scratch')).toEqual(['scratch']);
    await db.pool.query('INSERT INTO public.scratch VALUES (1)');
    await db.pool.query('CREATE OR REPLACE VIEW public.scratch_view AS SELECT * FROM public.scratch');
    await expect(protectTable(db.pool, 'public.scratch_view', 'x')).rejects.toThrow(ProtectError);
    await expect(protectTable(db.pool, 'fencepost.fences', 'x')).rejects.toThrow(/fencepost's own/);
    await expect(protectTable(db.pool, 'public.nothing_here', 'x')).rejects.toThrow(/does not exist/);
  });

  test('--list says NOT ENFORCED, with the reason, for every trigger that would let a write through; protect again restores it', async ({
    db,
    sql,
  }) => {
    // Invariant: "enforced" in the list means an unfenced INSERT is refused. Each tampering below
    // is done by the table's owner, who may; the list says so, and in most an unfenced INSERT lands.
    void sql;
    await db.pool.query('CREATE TABLE IF NOT EXISTS public.tampered (id int, v text)');
    await db.pool.query(`CREATE OR REPLACE FUNCTION public.no_op() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
    // [the owner's statement, the reason listed, whether an unfenced INSERT then lands]
    const tamperings: [string, RegExp, boolean][] = [
      ['ALTER TABLE public.tampered ENABLE REPLICA TRIGGER fencepost_fence', /fires only in replica sessions/, true],
      ['ALTER TABLE public.tampered DISABLE TRIGGER fencepost_fence', /is disabled/, true],
      ['DROP TRIGGER fencepost_fence ON public.tampered', /is missing/, true],
      [
        'DROP TRIGGER fencepost_fence ON public.tampered; CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.tampered FOR EACH STATEMENT EXECUTE FUNCTION public.no_op()',
        /calls public\.no_op\(\), not fencepost\.refuse_unfenced_write\(\)/,
        true,
      ],
      [
        "DROP TRIGGER fencepost_fence ON public.tampered; CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON public.tampered FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write('other-key')",
        /other arguments/,
        false,
      ],
      [
        "DROP TRIGGER fencepost_fence ON public.tampered; CREATE TRIGGER fencepost_fence BEFORE UPDATE OR DELETE ON public.tampered FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write('tampered')",
        /events it was declared for/,
        true,
      ],
      [
        "DROP TRIGGER fencepost_fence ON public.tampered; CREATE TRIGGER fencepost_fence BEFORE INSERT OR UPDATE OF v OR DELETE OR TRUNCATE ON public.tampered FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write('tampered')",
        /only on updates of some columns/,
        false,
      ],
    ];
    for (const [tamper, why, lands] of tamperings) {
      await protectTable(db.pool, 'public.tampered', 'tampered');
      const listed = async () => (await listProtected(db.pool)).find((p) => p.target === 'tampered')!;
      expect(await listed()).toMatchObject({ enforced: true, whyNot: null });
      expect(await code(db.pool.query(`INSERT INTO public.tampered VALUES (${id()}, 'refused')`))).toBe('FP403');
      await db.pool.query(tamper);
      const item = await listed();
      expect(item.enforced, tamper).toBe(false);
      expect(item.whyNot, tamper).toMatch(why);
      if (lands) expect(await code(db.pool.query(`INSERT INTO public.tampered VALUES (${id()}, 'unfenced')`)), tamper).toBe('ok');
    }
    await protectTable(db.pool, 'public.tampered', 'tampered');
    expect((await listProtected(db.pool)).find((p) => p.target === 'tampered')).toMatchObject({ enforced: true, whyNot: null });
    // The CLI prints the reason.
    await db.pool.query('ALTER TABLE public.tampered ENABLE REPLICA TRIGGER fencepost_fence');
    const cli = spawnSync(process.execPath, [BIN, 'protect', '--list'], {
      env: { ...process.env, DATABASE_URL: db.url, FENCEPOST_LOG_LEVEL: 'warn' },
      encoding: 'utf8',
    });
    expect(cli.status, cli.stderr).toBe(0);
    expect(cli.stdout).toContain(
      'table\ttampered\ttampered\tNOT ENFORCED: its trigger fires only in replica sessions (ENABLE REPLICA TRIGGER) (run protect again)',
    );
  });

  test('doctor warns of a protected table others can name (a schema several roles, or PUBLIC, may use) and of one not enforced; a schema of its own writer is quiet', async ({
    db,
    sql,
  }) => {
    // Invariant: doctor exits 3 and names the table whenever a role other than its writer could
    // queue a lock on it, or its trigger would let a write through.
    void sql;
    const writer = `${clientRoleFor(db.url)}_dw`;
    const other = `${clientRoleFor(db.url)}_do`;
    await db.pool.query(
      `DROP ROLE IF EXISTS ${writer}; DROP ROLE IF EXISTS ${other}; CREATE ROLE ${writer} NOLOGIN; CREATE ROLE ${other} NOLOGIN`,
    );
    try {
      await db.pool.query(
        `CREATE SCHEMA own_a; REVOKE ALL ON SCHEMA own_a FROM PUBLIC; GRANT USAGE ON SCHEMA own_a TO ${writer}; CREATE TABLE own_a.ledger (id int)`,
      );
      await db.pool.query(
        `CREATE SCHEMA shared_b; GRANT USAGE ON SCHEMA shared_b TO ${writer}, ${other}; CREATE TABLE shared_b.ledger (id int)`,
      );
      await db.pool.query('CREATE TABLE public.open_ledger (id int)');
      await protectTable(db.pool, 'own_a.ledger', 'doctor/a');
      await protectTable(db.pool, 'shared_b.ledger', 'doctor/b');
      await protectTable(db.pool, 'public.open_ledger', 'doctor/c');
      await db.pool.query('ALTER TABLE own_a.ledger DISABLE TRIGGER fencepost_fence');
      const doctor = () =>
        spawnSync(process.execPath, [BIN, 'doctor', '--database-url', db.url], {
          env: { ...process.env, FENCEPOST_LOG_LEVEL: 'warn' },
          encoding: 'utf8',
        });
      const r = doctor();
      expect(r.status, r.stderr).toBe(3);
      const lines = r.stdout.split('\n');
      expect(lines).toContain('Protected data:');
      expect(lines).toContain(
        '  warning [not_enforced]: table own_a.ledger: NOT ENFORCED: its trigger is disabled (run fencepost protect again)',
      );
      expect(lines.filter((l) => l.includes('[shared_schema]: table shared_b.ledger:'))).toEqual([
        expect.stringContaining(`roles ${[other, writer].sort().join(', ')} (USAGE on schema shared_b)`),
      ]);
      expect(lines.filter((l) => l.includes('[shared_schema]: table open_ledger:'))).toEqual([
        expect.stringContaining('every role (PUBLIC has USAGE on schema public)'),
      ]);
      expect(lines.filter((l) => l.includes('[shared_schema]: table own_a.ledger'))).toEqual([]);
      const json = JSON.parse(
        spawnSync(process.execPath, [BIN, 'doctor', '--json', '--database-url', db.url], { encoding: 'utf8' }).stdout,
      ) as { protectedData: { warnings: { reason: string; target: string }[] } };
      expect(json.protectedData.warnings).toContainEqual(
        expect.objectContaining({ reason: 'shared_schema', target: 'table shared_b.ledger' }),
      );
    } finally {
      await db.pool.query(
        'DROP SCHEMA IF EXISTS own_a CASCADE; DROP SCHEMA IF EXISTS shared_b CASCADE; DROP TABLE IF EXISTS public.open_ledger',
      );
      await db.pool
        .query(`DELETE FROM fencepost.protected_tables WHERE NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = relation)`)
        .catch(() => {});
      await db.pool.query(`DROP ROLE IF EXISTS ${writer}; DROP ROLE IF EXISTS ${other}`);
    }
  });

  test('covers the partitions present when it is protected', async ({ db, sql }) => {
    void sql;
    await db.pool.query(`CREATE TABLE public.events (id int, at int) PARTITION BY RANGE (at);
      CREATE TABLE public.events_1 PARTITION OF public.events FOR VALUES FROM (0) TO (100)`);
    const { tables } = await protectTable(db.pool, 'public.events', 'events');
    expect(tables).toEqual(['events', 'events_1']);
    expect(await code(db.pool.query('INSERT INTO public.events VALUES (1, 1)'))).toBe('FP403');
    expect(await code(db.pool.query('INSERT INTO public.events_1 VALUES (1, 1)'))).toBe('FP403');
  });
});
