// Every SQL statement the fence runs, as named builders returning { name?, text, values }.
// Named statements are prepared once per connection by node-postgres.
import type { QueryConfig } from 'pg';

export type Query = QueryConfig<unknown[]>;

export type OpKind = 'put' | 'delete' | 'fence';

export interface WriteRow {
  kind: OpKind;
  fenceKey: string;
  /** Object key; null for a fence-only advance. */
  key: string | null;
  token: bigint;
  contentType: string | null;
  body: Buffer | null;
}

/**
 * The fenced write, for a batch of operations with distinct fence keys and distinct object keys.
 * Check and write are one statement: the conditional upsert on `fences` returns a row only when
 * the token is ≥ the recorded one (ON CONFLICT locks the row and re-checks the WHERE against the
 * latest committed version), and the object write/delete joins on that row. A rejected operation
 * changes nothing. Rows are locked in key order so concurrent batches cannot deadlock on fences.
 *
 * An object also keeps the fence key (and token) of its last write: a write or delete naming another
 * fence key must also carry a token ≥ the CURRENT highest token of the object's fence, so a writer
 * cannot step around an object's fence by naming a fence it holds. `owner` locks such objects (and
 * every object a delete targets) FOR UPDATE, so it sees their latest fence key; `owner_fence` reads
 * those fences FOR SHARE, which waits for a concurrent raise and sees its latest committed version,
 * and holds them until commit. The row lock order stays fence (own) → object → fence (object's).
 * An object that moved to yet another fence meanwhile (its locked row names a fence `guard` has no
 * threshold for) is refused, never accepted. `guard.need` is that threshold: a fence this very
 * statement raised is skipped by `owner_fence` (a row this command updated), so its new highest
 * comes from `fence`; the object's own token covers a fence row that was never written (unfenced).
 * Such a write is `object_refused`: its own fence key was rightly raised (the caller holds that
 * token) but the object is untouched; for a delete, any object `owner` locked and the delete did
 * not remove counts as refused (never a 204 that left the object in place).
 * Result: one row per input with `highest_token` null when rejected, `version` set for puts.
 */
export function fencedWrite(rows: readonly WriteRow[], opts: { unguarded?: boolean } = {}): Query {
  return {
    // `unguarded` drops the token check (FENCEPOST_UNSAFE_FENCE_MODE=two-step): never in production.
    name: opts.unguarded ? 'fencepost_fenced_write_unguarded' : 'fencepost_fenced_write',
    text: `
WITH input AS (
  SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bytea[])
    AS t(ord, kind, fence_key, key, token, content_type, body)
),
fence AS (
  INSERT INTO fencepost.fences AS f (fence_key, highest_token, accepted)
  SELECT fence_key, token, 1 FROM input ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key) DO UPDATE
    SET highest_token = GREATEST(f.highest_token, EXCLUDED.highest_token), accepted = f.accepted + 1, updated_at = now()
    WHERE ${opts.unguarded ? 'true' : 'f.highest_token <= EXCLUDED.highest_token'}
  RETURNING f.fence_key, f.highest_token
),
owner AS (
  SELECT o.key, o.fence_key, o.token, i.fence_key AS named_fence_key
  FROM input i JOIN fence USING (fence_key) JOIN fencepost.objects o ON o.key = i.key
  WHERE i.kind = 'delete' OR (i.kind = 'put' AND o.fence_key <> i.fence_key)
  ORDER BY o.key
  FOR UPDATE OF o
),
owner_fence AS (
  SELECT f.fence_key, f.highest_token FROM fencepost.fences f
  WHERE f.fence_key IN (SELECT fence_key FROM owner WHERE fence_key <> named_fence_key)
  ORDER BY f.fence_key COLLATE "C"
  FOR SHARE OF f
),
guard AS (
  SELECT w.key, w.fence_key,
    GREATEST(w.token, s.highest_token, (SELECT n.highest_token FROM fence n WHERE n.fence_key = w.fence_key)) AS need
  FROM owner w LEFT JOIN owner_fence s USING (fence_key)
  WHERE w.fence_key <> w.named_fence_key
),
put AS (
  INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  SELECT i.key, i.fence_key, i.token, 1, i.content_type, i.body
  FROM input i JOIN fence USING (fence_key)
  WHERE i.kind = 'put' ORDER BY i.key
  ON CONFLICT (key) DO UPDATE
    SET fence_key = EXCLUDED.fence_key, token = EXCLUDED.token, version = o.version + 1,
        content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
    WHERE o.fence_key = EXCLUDED.fence_key
      OR EXISTS (SELECT 1 FROM guard g WHERE g.key = o.key AND g.fence_key = o.fence_key AND g.need <= EXCLUDED.token)
  RETURNING o.key, o.version
),
del AS (
  DELETE FROM fencepost.objects o
  USING input i JOIN fence USING (fence_key) LEFT JOIN guard g ON g.key = i.key
  WHERE i.kind = 'delete' AND o.key = i.key
    AND (o.fence_key = i.fence_key OR (g.fence_key = o.fence_key AND g.need <= i.token))
  RETURNING o.key
)
SELECT i.ord, fence.highest_token, put.version,
  fence.fence_key IS NOT NULL AND CASE i.kind
    WHEN 'put' THEN put.key IS NULL
    WHEN 'delete' THEN del.key IS NULL AND EXISTS (SELECT 1 FROM owner w WHERE w.key = i.key)
    ELSE false END AS object_refused
FROM input i
LEFT JOIN fence USING (fence_key)
LEFT JOIN put ON i.kind = 'put' AND put.key = i.key
LEFT JOIN del ON i.kind = 'delete' AND del.key = i.key
ORDER BY i.ord`,
    values: writeValues(rows),
  };
}

/**
 * Each object's fence key and that fence's highest token now (to explain an object_refused write);
 * the object's own token stands in for a fence row that was never written.
 */
export function objectFences(keys: readonly string[]): Query {
  return {
    name: 'fencepost_object_fences',
    text: `
SELECT o.key, o.fence_key, GREATEST(o.token, f.highest_token) AS highest_token
FROM fencepost.objects o LEFT JOIN fencepost.fences f USING (fence_key)
WHERE o.key = ANY($1::text[])`,
    values: [keys],
  };
}

function writeValues(rows: readonly WriteRow[]): unknown[] {
  return [
    rows.map((_, i) => i),
    rows.map((r) => r.kind),
    rows.map((r) => r.fenceKey),
    rows.map((r) => r.key),
    rows.map((r) => r.token.toString()),
    rows.map((r) => r.contentType),
    rows.map((r) => r.body),
  ];
}

/**
 * The same object upsert/delete with no fence at all: the benchmark's unfenced baseline and the
 * checker's "fence off" mode (FENCEPOST_UNSAFE_FENCE_MODE=off). Same result shape as fencedWrite.
 */
export function unfencedWrite(rows: readonly WriteRow[]): Query {
  return {
    name: 'fencepost_unfenced_write',
    text: `
WITH input AS (
  SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bytea[])
    AS t(ord, kind, fence_key, key, token, content_type, body)
),
put AS (
  INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  SELECT key, fence_key, token, 1, content_type, body FROM input WHERE kind = 'put' ORDER BY key
  ON CONFLICT (key) DO UPDATE
    SET fence_key = EXCLUDED.fence_key, token = EXCLUDED.token, version = o.version + 1,
        content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
  RETURNING o.key, o.version
),
del AS (
  DELETE FROM fencepost.objects o USING input i WHERE i.kind = 'delete' AND o.key = i.key RETURNING o.key
)
SELECT i.ord, i.token AS highest_token, put.version
FROM input i LEFT JOIN put ON i.kind = 'put' AND put.key = i.key
ORDER BY i.ord`,
    values: writeValues(rows),
  };
}

/** Highest token of each fence key (the two-step mode's separate check). */
export function highestTokens(fenceKeys: readonly string[]): Query {
  return {
    name: 'fencepost_highest_tokens',
    text: `SELECT fence_key, highest_token FROM fencepost.fences WHERE fence_key = ANY($1::text[])`,
    values: [fenceKeys],
  };
}

export interface RejectionRow {
  /** `transaction` for a refused POST /v1/transactions (one row per stale fence). */
  kind: OpKind | 'transaction';
  fenceKey: string;
  key: string | null;
  token: bigint;
  writerId: string | null;
  /** The fenced write counted it as accepted (object_refused): move that count to rejected. */
  undoAccept?: boolean;
}

/**
 * Records rejected operations: bumps each fence's `rejected` count, logs each rejection, and
 * returns each fence's highest token as it is now (read after the rejection, as the 409 reports).
 */
export function recordRejections(rows: readonly RejectionRow[]): Query {
  return {
    name: 'fencepost_record_rejections',
    text: `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bool[])
    AS t(operation, fence_key, key, token, writer_id, undo_accept)
),
counts AS (
  SELECT fence_key, count(*) AS n, count(*) FILTER (WHERE undo_accept) AS undo FROM input GROUP BY fence_key
),
bump AS (
  UPDATE fencepost.fences f SET rejected = f.rejected + c.n, accepted = f.accepted - c.undo
  FROM counts c WHERE f.fence_key = c.fence_key
  RETURNING f.fence_key, f.highest_token
),
log AS (
  INSERT INTO fencepost.rejections (fence_key, object_key, operation, token, highest_token, writer_id)
  SELECT i.fence_key, i.key, i.operation, i.token, b.highest_token, i.writer_id
  FROM input i JOIN bump b USING (fence_key)
)
SELECT fence_key, highest_token FROM bump`,
    values: [
      rows.map((r) => r.kind),
      rows.map((r) => r.fenceKey),
      rows.map((r) => r.key),
      rows.map((r) => r.token.toString()),
      rows.map((r) => r.writerId),
      rows.map((r) => r.undoAccept === true),
    ],
  };
}

export function readObject(key: string): Query {
  return {
    name: 'fencepost_read_object',
    text: `SELECT fence_key, token, version, content_type, body, updated_at FROM fencepost.objects WHERE key = $1`,
    values: [key],
  };
}

export function readFence(fenceKey: string): Query {
  return {
    name: 'fencepost_read_fence',
    text: `SELECT fence_key, highest_token, updated_at, accepted, rejected FROM fencepost.fences WHERE fence_key = $1`,
    values: [fenceKey],
  };
}

/** Keyset paging in fence-key order (byte order, so it is stable whatever the collation). */
export function listFences(after: string | null, limit: number): Query {
  return {
    name: 'fencepost_list_fences',
    text: `
SELECT fence_key, highest_token, updated_at, accepted, rejected FROM fencepost.fences
WHERE $1::text IS NULL OR fence_key COLLATE "C" > $1::text COLLATE "C"
ORDER BY fence_key COLLATE "C"
LIMIT $2`,
    values: [after, limit],
  };
}

export function statsTotals(): Query {
  return {
    name: 'fencepost_stats_totals',
    text: `SELECT count(*) AS fences, coalesce(sum(accepted), 0)::bigint AS accepted, coalesce(sum(rejected), 0)::bigint AS rejected FROM fencepost.fences`,
  };
}

/** Per-fence counts, the fences with the most rejections first. */
export function statsPerFence(limit: number): Query {
  return {
    name: 'fencepost_stats_per_fence',
    text: `
SELECT fence_key, highest_token, accepted, rejected FROM fencepost.fences
ORDER BY rejected DESC, accepted DESC, fence_key COLLATE "C"
LIMIT $1`,
    values: [limit],
  };
}

// ---- fenced SQL transactions (src/fence/transaction.ts) ------------------------------------------
// The fences of a transaction are locked and raised with fencedWrite (kind 'fence', byte order);
// these are the statements around it.

export type Isolation = 'read committed' | 'repeatable read' | 'serializable';

const BEGIN: Record<Isolation, string> = {
  'read committed': 'BEGIN ISOLATION LEVEL READ COMMITTED',
  'repeatable read': 'BEGIN ISOLATION LEVEL REPEATABLE READ',
  serializable: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
};

/**
 * BEGIN with the transaction's statement and lock timeouts, in one round trip. Everything spliced
 * is the proxy's own: the isolation from a fixed table, the timeouts validated integers.
 */
export function beginClientTransaction(isolation: Isolation, statementTimeoutMs: number, lockTimeoutMs: number): Query {
  if (!Number.isSafeInteger(statementTimeoutMs) || !Number.isSafeInteger(lockTimeoutMs)) throw new Error('timeouts must be integers');
  return { text: `${BEGIN[isolation]}; SET LOCAL statement_timeout = ${statementTimeoutMs}; SET LOCAL lock_timeout = ${lockTimeoutMs}` };
}

/**
 * The fence check and raise of a transaction (migration 0004), on the client login's connection.
 * Unnamed on purpose: the connection is DISCARDed between transactions.
 */
export function fenceTransaction(capability: string, fences: readonly { fenceKey: string; token: bigint }[]): Query {
  return {
    text: 'SELECT ord, highest_token::text AS highest_token, xact::text AS xact FROM fencepost.fence_transaction($1, $2::text[], $3::bigint[])',
    values: [capability, fences.map((f) => f.fenceKey), fences.map((f) => f.token.toString())],
  };
}

/** Right before COMMIT: the transaction id (must still be the fenced one), and durability forced on. */
export function sealTransaction(): Query {
  return { text: `SELECT txid_current()::text AS xact, set_config('synchronous_commit', 'on', true)` };
}

/** Between transactions on a pooled client connection: nothing of one session reaches the next. */
export function discardAll(): Query {
  return { text: 'DISCARD ALL' };
}

export function terminateBackend(pid: number): Query {
  return { text: 'SELECT pg_terminate_backend($1)', values: [pid] };
}

export function commitTransaction(): Query {
  return { text: 'COMMIT' };
}

export function rollbackTransaction(): Query {
  return { text: 'ROLLBACK' };
}

/**
 * `SET LOCAL <name> = <value>` with both as parameters: set_config(…, true) is SET LOCAL, and it
 * checks role membership like SET ROLE does. Nothing is spliced into SQL text.
 */
export function setLocal(name: 'statement_timeout' | 'role', value: string): Query {
  return { text: 'SELECT set_config($1, $2, true)', values: [name, value] };
}

/**
 * The settings a Postgres failover's safety depends on, as a new session of this role in this
 * database gets them: run on a connection opened without the proxy's forced options (durability.ts).
 */
export function durabilitySettings(): Query {
  return {
    text: `SELECT current_setting('synchronous_commit') AS synchronous_commit,
  current_setting('synchronous_standby_names') AS synchronous_standby_names,
  current_database() AS database, current_user AS role`,
  };
}

/**
 * Physical standbys streaming from this server, the possible failover targets (a logical walsender
 * is connected to a database; a physical one is not). Without pg_read_all_stats, every column but
 * pid reads null.
 */
export function replicationStandbys(): Query {
  return {
    text: `SELECT r.application_name, r.state, r.sync_state
FROM pg_stat_replication r LEFT JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datname IS NULL
ORDER BY r.application_name, r.pid`,
  };
}
