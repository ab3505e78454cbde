// Tenant A's hostile actions, through every way A can reach: its SQL endpoint session (its key's
// login, at its own token), POST /v1/transactions and HTTP object/fence writes with its key, and a
// direct Postgres login that is a member of its pgRole. Each attack runs until its signal aborts
// and reports what A was told (SQLSTATEs, HTTP codes): the harness checks that tenant B was not
// slowed past its bound meanwhile (run.ts).
//
// The lock-queue attacks are enumerated from the catalog: every table, view, sequence and function
// in every schema whose name starts with `fencepost`, and B's protected table. For each, session
// A1 holds an ordinary lock it can take (a fenced transaction of A's own, which holds what the
// fence holds; a read of the object when A may read it), and session A2 issues DDL that Postgres
// locks before it checks ownership (CREATE RULE: AccessExclusiveLock; CREATE TRIGGER; a temporary
// table whose foreign key names the object; CREATE STATISTICS; COMMENT ON), with a lock_timeout
// as long as the window, or the statements Postgres checks first (LOCK TABLE, ALTER, TRUNCATE) as
// controls. Every later writer of the object queues behind A2 while it waits.
import pg from 'pg';
import { Prng } from '../chaos/prng.ts';
import { directClient, fenceOptions, http, httpCode, sqlDoorClient, type Endpoints, type Tenants } from './tenants.ts';

export type AttackFamily = 'lock-queue' | 'long-transaction' | 'error-storm' | 'exhaustion' | 'huge-arguments' | 'fence-flood';

export interface AttackContext {
  e: Endpoints;
  t: Tenants;
  /** A's leader's token on its own fence (A is a legitimate writer of orders/ too). */
  aToken: bigint;
  /** How long a lock or transaction is held at most: the whole window. */
  holdMs: number;
  signal: AbortSignal;
}

export interface AttackOutcome {
  /** What A was told, counted: `42501`, `403 forbidden`, `413`, … ; `ok` for what was accepted. */
  answers: Record<string, number>;
  /** The longest A waited for an answer that was a refusal: a refusal after a wait was queued first. */
  longestRefusalMs: number;
}

export interface Attack {
  name: string;
  family: AttackFamily;
  /**
   * The documented open limit (docs/security.md, Tenants: "Queue a lock on a shared table"): a
   * lock-queue attack on a relation in a schema A's roles have USAGE on, other than A's own. The
   * harness still runs and reports it; the test's invariant covers every other attack.
   */
  knownOpen: boolean;
  run(ctx: AttackContext): Promise<AttackOutcome>;
}

// ---- outcomes -------------------------------------------------------------------------------------

class Tally implements AttackOutcome {
  answers: Record<string, number> = {};
  longestRefusalMs = 0;
  add(code: string, ms = 0): void {
    this.answers[code] = (this.answers[code] ?? 0) + 1;
    if (code !== 'ok' && ms > this.longestRefusalMs) this.longestRefusalMs = ms;
  }
}

function codeOf(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown };
  if (typeof e.code === 'string') return e.code;
  const m = String(e.message ?? err);
  return /timeout|abort/i.test(m) ? 'client-abort' : m.slice(0, 60);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(t), resolve()), { once: true });
  });

/** `fn` repeatedly until aborted; each answer tallied with how long it took. */
async function loop(signal: AbortSignal, tally: Tally, fn: () => Promise<string>, pauseMs = 10): Promise<void> {
  while (!signal.aborted) {
    const started = performance.now();
    let code: string;
    try {
      code = await fn();
    } catch (err) {
      code = codeOf(err);
    }
    if (signal.aborted && code !== 'ok') break; // the harness ended A's backends: not an answer
    tally.add(code, performance.now() - started);
    await sleep(pauseMs, signal);
  }
}

async function query(c: pg.Client, sql: string, values?: unknown[]): Promise<string> {
  await c.query(sql, values);
  return 'ok';
}

async function connected(c: pg.Client, tally: Tally): Promise<pg.Client | null> {
  try {
    await c.connect();
    return c;
  } catch (err) {
    tally.add(codeOf(err));
    return null;
  }
}

/** A's SQL endpoint session at its own token, statement timeout lifted (SET is not bounded). */
async function aSqlSession(ctx: AttackContext, tally: Tally): Promise<pg.Client | null> {
  const c = await connected(sqlDoorClient(ctx.e, ctx.t.a, fenceOptions(ctx.aToken, ctx.t.a.fenceKey)), tally);
  if (c !== null) await c.query('SET statement_timeout = 0').catch(() => {});
  return c;
}

async function aDirect(ctx: AttackContext, tally: Tally): Promise<pg.Client | null> {
  return await connected(directClient(ctx.e, ctx.t), tally);
}

async function aTransaction(
  ctx: AttackContext,
  statements: { sql: string; params?: unknown[] }[],
  fences = [{ key: ctx.t.a.fenceKey, token: String(ctx.aToken) }],
): Promise<string> {
  const r = await http(
    ctx.e,
    ctx.t.a,
    'POST',
    '/v1/transactions',
    { 'content-type': 'application/json' },
    JSON.stringify({ fences, statements }),
    ctx.signal,
  );
  return r.status === 200 ? 'ok' : httpCode(r);
}

async function endAll(clients: (pg.Client | null)[]): Promise<void> {
  await Promise.all(clients.map((c) => c?.end().catch(() => {})));
}

// ---- lock-queue targets, from the catalog --------------------------------------------------------

export interface Target {
  /** Schema-qualified, quoted as regclass / regprocedure print it. */
  name: string;
  kind: 'table' | 'view' | 'sequence' | 'function';
  schema: string;
  /** A's roles have USAGE on the schema (they can name the object at all). */
  aUsage: boolean;
  /** A's roles may SELECT it (a relation): A1 can hold an AccessShareLock on it directly. */
  aSelect: boolean;
  /** Primary key's first column's type (a foreign key naming the table), or null. */
  pkType: string | null;
  columns: string[];
}

/** Every table, view, sequence and function in schemas named `fencepost…`, and B's protected table. */
export async function lockTargets(admin: pg.Pool, t: Tenants): Promise<Target[]> {
  const { rows } = await admin.query<{
    name: string;
    kind: Target['kind'];
    schema: string;
    a_usage: boolean;
    a_select: boolean;
    pk_type: string | null;
    columns: string[];
  }>(
    `SELECT c.oid::regclass::text AS name,
            CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'view' WHEN 'S' THEN 'sequence' ELSE 'table' END AS kind,
            n.nspname AS schema,
            has_schema_privilege($1, n.oid, 'USAGE') AS a_usage,
            has_schema_privilege($1, n.oid, 'USAGE') AND has_table_privilege($1, c.oid, 'SELECT') AS a_select,
            (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
              WHERE i.indrelid = c.oid AND i.indisprimary) AS pk_type,
            ARRAY(SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum) AS columns
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE (starts_with(n.nspname, 'fencepost') OR c.oid = $2::regclass) AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
     UNION ALL
     SELECT p.oid::regprocedure::text, 'function', n.nspname, has_schema_privilege($1, n.oid, 'USAGE'), false, NULL, '{}'
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE starts_with(n.nspname, 'fencepost') AND p.prokind IN ('f', 'p')
     ORDER BY 1`,
    [t.direct.login, t.b.table],
  );
  return rows.map((r) => ({
    name: r.name,
    kind: r.kind,
    schema: r.schema,
    aUsage: r.a_usage,
    aSelect: r.a_select,
    pkType: r.pk_type,
    columns: r.columns,
  }));
}

export type Door = 'direct' | 'sql' | 'tx';
export const DOORS: readonly Door[] = ['direct', 'sql', 'tx'];

/** The DDL A2 may try on a target: [variant name, statement, locks before it checks?]. */
export function ddlFor(target: Target): [string, string][] {
  const n = target.name;
  switch (target.kind) {
    case 'table':
    case 'view':
      return [
        ['create-rule', `CREATE RULE tenancy_rule AS ON INSERT TO ${n} DO INSTEAD NOTHING`],
        [
          'create-trigger',
          `CREATE TRIGGER tenancy_trigger BEFORE UPDATE ON ${n} FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()`,
        ],
        ...(target.pkType !== null
          ? [['foreign-key', `CREATE TEMPORARY TABLE tenancy_fk (x ${target.pkType} REFERENCES ${n})`] as [string, string]]
          : []),
        ...(target.kind === 'table' && target.columns.length >= 2
          ? [
              ['create-statistics', `CREATE STATISTICS pg_temp.tenancy_stats ON ${target.columns[0]}, ${target.columns[1]} FROM ${n}`] as [
                string,
                string,
              ],
            ]
          : []),
        ['comment', `COMMENT ON ${target.kind === 'view' ? 'VIEW' : 'TABLE'} ${n} IS 'tenant A was here'`],
        ['lock-table', `LOCK TABLE ${n} IN ACCESS EXCLUSIVE MODE`],
        ['alter', `ALTER TABLE ${n} ADD COLUMN tenancy int`],
        ['truncate', `TRUNCATE ${n}`],
      ];
    case 'sequence':
      return [
        ['comment', `COMMENT ON SEQUENCE ${n} IS 'tenant A was here'`],
        ['alter', `ALTER SEQUENCE ${n} RESTART`],
        ['lock-table', `LOCK TABLE ${n} IN ACCESS EXCLUSIVE MODE`],
      ];
    case 'function':
      return [
        ['comment', `COMMENT ON FUNCTION ${n} IS 'tenant A was here'`],
        ['alter', `ALTER FUNCTION ${n} SET search_path = public`],
      ];
  }
}

/**
 * A1: what holds an ordinary lock while A2 queues. A fenced transaction of A's own on the SQL
 * endpoint (it holds what the fence holds: the epoch sequence, the counts row's table) and, when
 * A may read the target, a direct login's read of it. Both sleep for the window.
 */
async function holdOrdinaryLocks(ctx: AttackContext, target: Target, tally: Tally): Promise<(pg.Client | null)[]> {
  const holders: (pg.Client | null)[] = [];
  const s = await aSqlSession(ctx, tally);
  holders.push(s);
  if (s !== null) {
    s.query('BEGIN')
      .then(() => s.query(`INSERT INTO ${ctx.t.a.table} (v) VALUES ('a1')`))
      .then(() => s.query('SELECT pg_sleep($1)', [ctx.holdMs / 1000]))
      .then(() => s.query('COMMIT'))
      .then(
        () => tally.add('ok'),
        (err: unknown) => ctx.signal.aborted || tally.add(`holder ${codeOf(err)}`),
      );
  }
  if (target.aSelect) {
    const d = await aDirect(ctx, tally);
    holders.push(d);
    if (d !== null) {
      d.query('BEGIN')
        .then(() => d.query(`SELECT 1 FROM ${target.name} LIMIT 0`))
        .then(() => d.query('SELECT pg_sleep($1)', [ctx.holdMs / 1000]))
        .then(() => d.query('COMMIT'))
        .catch((err: unknown) => ctx.signal.aborted || tally.add(`holder ${codeOf(err)}`));
    }
  }
  await sleep(150, ctx.signal); // the holders' locks taken before A2 queues
  return holders;
}

export function lockQueueAttack(target: Target, variant: string, ddl: string, door: Door, t: Tenants): Attack {
  const own = target.schema === t.a.schema;
  return {
    name: `lock-queue:${variant}:${target.name}:${door}`,
    family: 'lock-queue',
    knownOpen: target.kind !== 'function' && target.aUsage && !own,
    async run(ctx) {
      const tally = new Tally();
      const holders = await holdOrdinaryLocks(ctx, target, tally);
      const clients: (pg.Client | null)[] = [];
      try {
        if (door === 'tx') {
          await loop(ctx.signal, tally, () => aTransaction(ctx, [{ sql: ddl }]));
        } else {
          const c = door === 'direct' ? await aDirect(ctx, tally) : await aSqlSession(ctx, tally);
          clients.push(c);
          if (c !== null) {
            await c.query(`SET lock_timeout = ${Math.round(ctx.holdMs)}`).catch(() => {});
            // In a transaction block (LOCK TABLE needs one; a lock taken is held until ROLLBACK).
            await loop(ctx.signal, tally, async () => {
              try {
                await c.query('BEGIN');
                return await query(c, ddl);
              } finally {
                await c.query('ROLLBACK').catch(() => {});
              }
            });
          }
        }
      } finally {
        await endAll([...clients, ...holders]);
      }
      return tally;
    },
  };
}

// ---- the other families ---------------------------------------------------------------------------

const HUGE = 4 * 1024 * 1024;

function otherAttacks(): Attack[] {
  const attack = (name: string, family: AttackFamily, run: (ctx: AttackContext, tally: Tally) => Promise<void>): Attack => ({
    name,
    family,
    knownOpen: false,
    async run(ctx) {
      const tally = new Tally();
      await run(ctx, tally);
      return tally;
    },
  });
  const parallel = async (n: number, fn: (i: number) => Promise<void>) =>
    void (await Promise.all(Array.from({ length: n }, (_, i) => fn(i))));
  const stormStatements = (state: string) => [
    {
      sql: `CREATE FUNCTION pg_temp.tenancy_boom() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'tenant A storm' USING ERRCODE = '${state}'; END $$`,
    },
    { sql: 'SELECT pg_temp.tenancy_boom()' },
  ];
  const list: Attack[] = [
    attack('long-transaction:sql', 'long-transaction', async (ctx, tally) => {
      await parallel(3, async () => {
        const c = await aSqlSession(ctx, tally);
        if (c === null) return;
        try {
          await loop(ctx.signal, tally, async () => {
            await c.query('BEGIN');
            await c.query(`INSERT INTO ${ctx.t.a.table} (v) VALUES ('long')`);
            await c.query('SELECT pg_sleep($1)', [ctx.holdMs / 1000]);
            return await query(c, 'COMMIT');
          });
        } finally {
          await c.end().catch(() => {});
        }
      });
    }),
    attack('long-transaction:tx', 'long-transaction', async (ctx, tally) => {
      await parallel(4, () =>
        loop(ctx.signal, tally, () =>
          aTransaction(ctx, [{ sql: `INSERT INTO ${ctx.t.a.table} (v) VALUES ('long')` }, { sql: 'SELECT pg_sleep(4.5)' }]),
        ),
      );
    }),
    attack('long-transaction:direct', 'long-transaction', async (ctx, tally) => {
      const c = await aDirect(ctx, tally);
      if (c === null) return;
      try {
        await loop(ctx.signal, tally, async () => {
          await c.query('BEGIN');
          await c.query(`SELECT * FROM ${ctx.t.a.table} FOR UPDATE`);
          await c.query('SELECT pg_sleep($1)', [ctx.holdMs / 1000]);
          return await query(c, 'COMMIT');
        });
      } finally {
        await c.end().catch(() => {});
      }
    }),
    ...['57P01', '08006', '25006', '40001', '55P03'].flatMap((state) => [
      attack(`error-storm:${state}:tx`, 'error-storm', async (ctx, tally) => {
        await parallel(3, () => loop(ctx.signal, tally, () => aTransaction(ctx, stormStatements(state)), 0));
      }),
      attack(`error-storm:${state}:sql`, 'error-storm', async (ctx, tally) => {
        const c = await aSqlSession(ctx, tally);
        if (c === null) return;
        try {
          await c.query(stormStatements(state)[0]!.sql).catch(() => {});
          await loop(ctx.signal, tally, () => query(c, 'SELECT pg_temp.tenancy_boom()'), 0);
        } finally {
          await c.end().catch(() => {});
        }
      }),
    ]),
    attack('exhaustion:sql-sessions', 'exhaustion', async (ctx, tally) => {
      const clients: (pg.Client | null)[] = [];
      try {
        // More than the key's share (FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY): the rest are refused.
        await parallel(8, async () => {
          for (let i = 0; i < 8 && !ctx.signal.aborted; i++) {
            const c = await aSqlSession(ctx, tally);
            clients.push(c);
            if (c !== null) tally.add('ok');
          }
        });
        await sleep(ctx.holdMs, ctx.signal);
      } finally {
        await endAll(clients);
      }
    }),
    attack('exhaustion:tx-slots', 'exhaustion', async (ctx, tally) => {
      await parallel(24, () => loop(ctx.signal, tally, () => aTransaction(ctx, [{ sql: 'SELECT pg_sleep(1)' }]), 0));
    }),
    attack('exhaustion:direct-connections', 'exhaustion', async (ctx, tally) => {
      const clients: (pg.Client | null)[] = [];
      try {
        await parallel(2 * ctx.t.direct.connectionLimit, async () => {
          const c = await aDirect(ctx, tally);
          clients.push(c);
          if (c !== null) tally.add('ok');
        });
        await sleep(ctx.holdMs, ctx.signal);
      } finally {
        await endAll(clients);
      }
    }),
    attack('huge-arguments:http', 'huge-arguments', async (ctx, tally) => {
      const body = Buffer.alloc(HUGE, 0x61);
      const txBody = JSON.stringify({
        fences: [{ key: ctx.t.a.fenceKey, token: String(ctx.aToken) }],
        statements: [{ sql: 'SELECT $1::text IS NULL', params: ['x'.repeat(HUGE)] }],
      });
      const key = 'orders/' + 'k'.repeat(256 * 1024);
      const digits = '9'.repeat(64 * 1024);
      await loop(
        ctx.signal,
        tally,
        async () => {
          const rs = await Promise.all([
            http(
              ctx.e,
              ctx.t.a,
              'PUT',
              '/v1/objects/orders%2Fhuge',
              { 'fencing-token': String(ctx.aToken), 'fence-key': ctx.t.a.fenceKey, 'content-type': 'application/octet-stream' },
              body,
              ctx.signal,
            ),
            http(
              ctx.e,
              ctx.t.a,
              'PUT',
              `/v1/fences/${encodeURIComponent(key)}`,
              { 'fencing-token': String(ctx.aToken) },
              undefined,
              ctx.signal,
            ),
            http(
              ctx.e,
              ctx.t.a,
              'PUT',
              '/v1/objects/orders%2Fx',
              { 'fencing-token': String(ctx.aToken), 'fence-key': key.slice(0, 12 * 1024) },
              'x',
              ctx.signal,
            ),
            http(ctx.e, ctx.t.a, 'PUT', '/v1/fences/orders%2Fx', { 'fencing-token': digits.slice(0, 12 * 1024) }, undefined, ctx.signal),
            http(ctx.e, ctx.t.a, 'POST', '/v1/transactions', { 'content-type': 'application/json' }, txBody, ctx.signal),
          ]);
          for (const r of rs.slice(0, -1)) tally.add(r.status === 200 ? 'ok' : httpCode(r));
          const last = rs[rs.length - 1]!;
          return last.status === 200 ? 'ok' : httpCode(last);
        },
        200,
      );
    }),
    attack('huge-arguments:sql-startup', 'huge-arguments', async (ctx, tally) => {
      // A startup packet past Postgres's 10000 bytes: refused before the session exists.
      await loop(
        ctx.signal,
        tally,
        async () => {
          const c = sqlDoorClient(ctx.e, ctx.t.a, fenceOptions(ctx.aToken, 'orders/' + 'k'.repeat(20_000)));
          const r = (await connected(c, tally)) === null ? 'startup refused' : 'ok';
          await c.end().catch(() => {});
          return r;
        },
        200,
      );
    }),
    // Each of these on A's own SQL session at its own token, one multi-MB argument at a time.
    ...(
      [
        ['sql-setting', () => `SET tenancy.setting = '${'k'.repeat(HUGE)}'`, undefined],
        ['sql-own-row', () => 'INSERT INTO orders.items (v) VALUES ($1)', ['k'.repeat(HUGE)]],
        ['sql-fence-key', () => `SET fencepost.fence_key = 'orders/${'k'.repeat(1024 * 1024)}'`, undefined],
        ['sql-token', () => `SET fencepost.token = '${'9'.repeat(1024 * 1024)}'`, undefined],
      ] as [string, () => string, unknown[] | undefined][]
    ).map(([variant, text, values]) =>
      attack(`huge-arguments:${variant}`, 'huge-arguments', async (ctx, tally) => {
        const c = await aSqlSession(ctx, tally);
        if (c === null) return;
        const statement = text();
        try {
          await loop(
            ctx.signal,
            tally,
            async () => {
              tally.add(await query(c, statement, values).catch(codeOf));
              // A transaction with what the session now holds, then the session set back.
              const r = await query(c, 'SELECT 1').catch(codeOf);
              await c.query(`SET fencepost.fence_key = '${ctx.t.a.fenceKey}'; SET fencepost.token = '${ctx.aToken}'`).catch(() => {});
              return r;
            },
            200,
          );
        } finally {
          await c.end().catch(() => {});
        }
      }),
    ),
    attack('fence-flood:http', 'fence-flood', async (ctx, tally) => {
      let n = 0;
      await parallel(4, () =>
        loop(
          ctx.signal,
          tally,
          async () => {
            const r = await http(
              ctx.e,
              ctx.t.a,
              'PUT',
              `/v1/fences/${encodeURIComponent(`orders/flood/${Date.now()}-${n++}`)}`,
              { 'fencing-token': '1' },
              undefined,
              ctx.signal,
            );
            return r.status === 200 ? 'ok' : httpCode(r);
          },
          0,
        ),
      );
    }),
    attack('fence-flood:tx', 'fence-flood', async (ctx, tally) => {
      let n = 0;
      await parallel(2, () =>
        loop(
          ctx.signal,
          tally,
          () => {
            const base = `${Date.now()}-${n++}`;
            return aTransaction(
              ctx,
              [{ sql: 'SELECT 1' }],
              Array.from({ length: 100 }, (_, i) => ({ key: `orders/flood-tx/${base}/${i}`, token: '1' })),
            );
          },
          0,
        ),
      );
    }),
  ];
  return list;
}

/** Every attack: the lock-queue variants on every target through every door, and the other families. */
export async function allAttacks(admin: pg.Pool, t: Tenants): Promise<Attack[]> {
  const targets = await lockTargets(admin, t);
  const lockQueue = targets.flatMap((target) =>
    ddlFor(target).flatMap(([variant, ddl]) => DOORS.map((door) => lockQueueAttack(target, variant, ddl, door, t))),
  );
  return [...lockQueue, ...otherAttacks()];
}

/** `k` attacks for a case: a family at random, then a variant of it, no attack twice. */
export function pickMix(rng: Prng, pool: readonly Attack[], k: number): Attack[] {
  const families = [...new Set(pool.map((a) => a.family))];
  const chosen: Attack[] = [];
  for (let tries = 0; chosen.length < Math.min(k, pool.length) && tries < 100; tries++) {
    const family = rng.pick(families);
    const a = rng.pick(pool.filter((x) => x.family === family));
    if (!chosen.includes(a)) chosen.push(a);
  }
  return chosen;
}
