// Protected data: what each fence key guards, declared by an operator (`fencepost protect`) and
// stored in the database (migration 0017). Postgres enforces it, not the proxy:
// - a protected table gets the trigger `fencepost_fence` (definitions.ts refuse_unfenced_write),
//   FOR EACH STATEMENT before INSERT, UPDATE, DELETE and TRUNCATE (COPY FROM and MERGE fire them
//   too), with the fence key and its epoch sequence (rule.ts) as arguments: a statement of a
//   session that did not pass that fence key's fence in its current epoch fails with FP403,
//   through either SQL door and straight to Postgres alike. Partitions and inheritance children
//   present when the table is protected get the trigger too (a write to a child fires only the
//   child's statement triggers).
// - a protected object-key prefix: objects under it are fenced by its fence key, whatever the
//   request's Fence-Key says; while any prefix is protected, fencepost.objects has the trigger
//   `fencepost_fence` (refuse_misfenced_object) refusing any other.
// What the trigger cannot stop: the table's owner (or a superuser) dropping or disabling it, or a
// superuser's session_replication_role = replica. Writers' roles must not own protected tables.
import pg from 'pg';
import * as q from './sql/protection.ts';
import { keyProblem } from './key.ts';
import { sqlState } from './pg-errors.ts';
import { withClient } from './checkout.ts';
import { INSUFFICIENT_PRIVILEGE } from './sqlstate.ts';
import { ProtectError } from './errors.ts';

export interface ProtectedItem {
  kind: 'table' | 'prefix';
  /** The table (as regclass text) or the prefix. */
  target: string;
  fenceKey: string;
  /** Its trigger is there, enabled in ordinary sessions, and the fence's own, as declared. */
  enforced: boolean;
  /** Why not, when not enforced. */
  whyNot: string | null;
}

export interface ProtectedTables {
  /** The tables that got the trigger: the one named and its partitions or children. */
  tables: string[];
  /** The owner of each (the role that could drop the trigger). */
  owners: string[];
}

function checkFenceKey(fenceKey: string): void {
  const problem = keyProblem(fenceKey);
  if (problem !== null) throw new ProtectError(`fence key ${JSON.stringify(fenceKey)} ${problem}`);
}

async function inTransaction<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return await withClient(pool, async (client) => {
    try {
      await client.query('BEGIN');
      await client.query(q.lock());
      const result = await work(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      throw err;
    }
  });
}

async function tableFamily(client: pg.PoolClient, table: string) {
  const { rows } = await client.query<{ oid: string; name: string; owner: string; nspname: string }>(q.family(table));
  if (rows.length === 0) {
    const kind = (await client.query<{ relkind: string }>(q.relkind(table))).rows[0]?.relkind;
    throw new ProtectError(
      kind === undefined ? `table ${table} does not exist` : `${table} is not a table (relkind ${kind}): protect the table it writes to`,
    );
  }
  if (rows.some((r) => r.nspname === 'fencepost')) throw new ProtectError(`${table} is fencepost's own table: it is protected already`);
  return rows;
}

/** Protects `table` (and its partitions or children) with the fence of `fenceKey`. */
export async function protectTable(pool: pg.Pool, table: string, fenceKey: string): Promise<ProtectedTables> {
  checkFenceKey(fenceKey);
  return inTransaction(pool, async (client) => {
    const family = await tableFamily(client, table);
    const me = (await client.query<{ u: string }>(q.currentUser())).rows[0]!.u;
    for (const rel of family) {
      await client.query(q.declareTable(rel.oid, fenceKey));
      try {
        await client.query(q.dropTrigger(rel.name));
        await client.query(q.tableTrigger(rel.name, fenceKey));
      } catch (err) {
        if (sqlState(err) !== INSUFFICIENT_PRIVILEGE) throw err;
        throw new ProtectError(
          `the proxy's database role may not create triggers on ${rel.name} (${(err as Error).message}); have its owner (${rel.owner}) or a superuser run:`,
          [`GRANT TRIGGER ON ${rel.name} TO ${pg.escapeIdentifier(me)}`],
        );
      }
    }
    return { tables: family.map((r) => r.name), owners: [...new Set(family.map((r) => r.owner))] };
  });
}

/** Takes the protection off `table` and its partitions or children. */
export async function unprotectTable(pool: pg.Pool, table: string): Promise<string[]> {
  return inTransaction(pool, async (client) => {
    const family = await tableFamily(client, table);
    for (const rel of family) {
      await client.query(q.forgetTable(rel.oid));
      await client.query(q.dropTrigger(rel.name));
    }
    return family.map((r) => r.name);
  });
}

/** Objects whose keys start with `prefix` are fenced by `fenceKey`. */
export async function protectPrefix(pool: pg.Pool, prefix: string, fenceKey: string): Promise<void> {
  checkFenceKey(fenceKey);
  const problem = keyProblem(prefix);
  if (problem !== null) throw new ProtectError(`prefix ${JSON.stringify(prefix)} ${problem}`);
  await inTransaction(pool, async (client) => {
    const first = (await client.query(q.anyPrefix())).rowCount === 0;
    await client.query(q.declarePrefix(prefix, fenceKey));
    if (first) {
      await client.query(q.dropTrigger('fencepost.objects'));
      await client.query(q.objectsTrigger());
    }
  });
}

/** Takes the protection off `prefix`; returns false when it was not protected. */
export async function unprotectPrefix(pool: pg.Pool, prefix: string): Promise<boolean> {
  return inTransaction(pool, async (client) => {
    const removed = ((await client.query(q.forgetPrefix(prefix))).rowCount ?? 0) > 0;
    if ((await client.query(q.anyPrefix())).rowCount === 0) await client.query(q.dropTrigger('fencepost.objects'));
    return removed;
  });
}

export async function listProtected(pool: pg.Pool): Promise<ProtectedItem[]> {
  const { rows } = await pool.query<{
    kind: 'table' | 'prefix';
    target: string;
    fence_key: string;
    enforced: boolean;
    why_not: string | null;
  }>(q.list());
  return rows.map((r) => ({ kind: r.kind, target: r.target, fenceKey: r.fence_key, enforced: r.enforced, whyNot: r.why_not }));
}

/** The protected prefixes and their fence keys, longest prefix first. */
/** What `fencepost doctor` says of the protected data: a warning per item, with a stable reason. */
export interface ProtectedDataReport {
  /** Tables and prefixes protected. */
  protected: number;
  warnings: {
    reason: 'not_enforced' | 'shared_schema' | 'prepared_transactions' | 'cannot_end_sessions';
    target: string;
    message: string;
  }[];
}

/**
 * Protected data as doctor checks it: every trigger enforced (listProtected), and each protected
 * table in a schema only one role besides its owner may use. Postgres takes some DDL locks
 * (CREATE RULE, CREATE TRIGGER, a foreign key) before it checks privileges, so a role that can name
 * a table can queue a lock on it behind a long transaction of its own, and stall every writer of it.
 * Nothing to say on a database fencepost was never migrated into.
 */
export async function protectedDataReport(pool: pg.Pool): Promise<ProtectedDataReport> {
  const { rows: installed } = await pool.query<{ installed: boolean }>(q.installed());
  if (!installed[0]?.installed) return { protected: 0, warnings: [] };
  const items = await listProtected(pool);
  const warnings: ProtectedDataReport['warnings'] = items
    .filter((i) => !i.enforced)
    .map((i) => ({
      reason: 'not_enforced' as const,
      target: `${i.kind} ${i.target}`,
      message: `${i.kind} ${i.target}: NOT ENFORCED: ${i.whyNot ?? "its trigger is not the fence's"} (run fencepost protect again)`,
    }));
  const { rows } = await pool.query<{ target: string; schema: string; roles: string[] }>(q.schemaUsers());
  for (const r of rows) {
    if (r.roles.length <= 1 && !r.roles.includes('PUBLIC')) continue;
    const who = r.roles.includes('PUBLIC')
      ? `every role (PUBLIC has USAGE on schema ${r.schema})`
      : `roles ${r.roles.join(', ')} (USAGE on schema ${r.schema})`;
    warnings.push({
      reason: 'shared_schema',
      target: `table ${r.target}`,
      message: `table ${r.target}: ${who} can name it in DDL that locks it before privileges are checked, and so stall its writers; keep it in a schema only its writers' role may use`,
    });
  }
  // The raise ends older-token connections: what it needs, and what it cannot end.
  const { rows: rev } = await pool.query<{ max_prepared: number; owner: string; can_end: boolean }>(q.revocation());
  const r = rev[0];
  if (r !== undefined && !r.can_end) {
    warnings.push({
      reason: 'cannot_end_sessions',
      target: `role ${r.owner}`,
      message: `role ${r.owner} (the fence's owner) can neither see nor end other roles' sessions: a raise fails while an older token's SQL connection is open; GRANT pg_read_all_stats, pg_signal_backend TO ${r.owner}`,
    });
  }
  if (r !== undefined && r.max_prepared > 0) {
    warnings.push({
      reason: 'prepared_transactions',
      target: 'max_prepared_transactions',
      message: `max_prepared_transactions is ${r.max_prepared}: a fenced SQL connection may PREPARE a transaction that wrote only unprotected tables, and it outlives the raise that ends the connection; set it to 0, or protect the tables (fencepost protect)`,
    });
  }
  return { protected: items.length, warnings };
}

export async function protectedPrefixes(pool: pg.Pool): Promise<{ prefix: string; fenceKey: string }[]> {
  const { rows } = await pool.query<{ prefix: string; fence_key: string }>(q.prefixes());
  return rows
    .map((r) => ({ prefix: r.prefix, fenceKey: r.fence_key }))
    .sort((a, b) => Buffer.byteLength(b.prefix) - Buffer.byteLength(a.prefix));
}

/** The longest of `prefixes` (protectedPrefixes' order) that `objectKey` starts with, or null: the trigger's choice. */
export function protectingPrefix<P extends { prefix: string; fenceKey: string }>(prefixes: readonly P[], objectKey: string): P | null {
  for (const p of prefixes) if (objectKey.startsWith(p.prefix)) return p;
  return null;
}
