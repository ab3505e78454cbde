// Every SQL statement the fence runs, as named builders returning { name?, text, values }.
// Named statements are prepared once per connection by node-postgres.
import type { QueryConfig } from 'pg';
import { ROLE_NAME } from './client-logins.ts';
import { epochSequence, fenceCtes, raiseFences as raiseFencesStep, shareFences } from './rule.ts';
import { RESET_SESSION } from './session-reset.ts';
import { shardSql } from './shards.ts';

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
  /**
   * If-Match of a put or delete: `*` (the object exists) or ETags (as ETAG_SQL spells them, without
   * quotes), one of which the object must have; null for none.
   */
  ifMatch?: '*' | readonly string[] | null;
  /** If-None-Match: * of a put or delete: the object must not exist. */
  ifNoneMatch?: boolean;
  /** Writer-Id of the request: a fence this write raises records it (`raised_by`, migration 0007). */
  writerId?: string | null;
}

/**
 * An object's ETag, without its quotes: `<incarnation>.<version>` (migration 0006). The version
 * counts writes to the key; the incarnation tells apart a key written again after a delete.
 */
const ETAG_SQL = (o: string) => `(${o}.incarnation::text || '.' || ${o}.version::text)`;

/** What an ETag of ETAG_SQL looks like; any other tag can never match. */
export const ETAG_FORM = /^[0-9]+\.[0-9]+$/;

/** This backend's counter row for writes and rejections (shards.ts). */
const SHARD = shardSql('write');

/**
 * The fenced write, for a batch of operations with distinct object keys and ONE token per fence
 * key (a batch may carry many writes of a fence key; the store keeps tokens apart). Check and write
 * are one statement: the fence rule (rule.ts fenceCtes: `held`, `raised`, `fence`) over the
 * batch's fence keys, then the object writes joined on `fence` (the fences the batch passed). A
 * raise records the Writer-Id of a write with the new token ($10) as `raised_by`. Counts go to
 * fence_counts and totals (one counter row per fence and backend), never to the fence row.
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
 *
 * Conditional writes (`if_match`, `if_none_match`: If-Match and If-None-Match: *) are checked in
 * the same statement, on the object as `owner` locked it (so its latest version, held until
 * commit): `owner` also locks the object of every put or delete with a precondition, and `unmet`
 * lists those whose precondition fails on it (If-Match on an absent object fails). An unmet write
 * is left out of `put` and `del`. One race is caught by the write itself: an object created after
 * the statement's snapshot is invisible to `owner`, so a put with If-None-Match: * finds it only
 * on conflict, and its DO UPDATE refuses. The fence comes first: a write below its own fence is
 * stale whatever its precondition, and one the object's fence refuses (`guard`) is
 * `object_refused`; otherwise an unapplied conditional write is `precondition_failed`. Like a
 * delete of a missing key, it has still raised its own fence (the caller holds that token). It
 * counts neither as accepted nor as rejected (nothing was written, and no fence refused it).
 * Result: one row per input with `highest_token` null when rejected, `version` and `etag` set for
 * puts.
 */
export function fencedWrite(rows: readonly WriteRow[]): Query {
  // An operation passes only with the token its fence now holds: in a batch that raises a fence, a
  // lower token of the same fence is stale (the raise is ordered first; the requests were concurrent).
  const passes = (i: string) => `fence.fence_key = ${i}.fence_key AND fence.highest_token = ${i}.token`;
  return {
    name: 'fencepost_fenced_write',
    text: `
WITH input AS (
  SELECT t.ord, t.kind, t.fence_key, t.key, t.token, t.content_type,
    ${bodyOf('$7', 't')} AS body,
    t.if_match, t.if_none_match
  FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $11::int[], $12::int[], $8::text[], $9::boolean[])
    AS t(ord, kind, fence_key, key, token, content_type, body_start, body_length, if_match, if_none_match)
),
keys AS (
  SELECT i.fence_key, max(i.token) AS token, (array_agg(w.writer_id ORDER BY i.token DESC, i.ord))[1] AS writer_id
  FROM input i LEFT JOIN unnest($10::text[]) WITH ORDINALITY AS w(writer_id, n) ON w.n = i.ord + 1
  GROUP BY i.fence_key
),
${fenceCtes('keys', 'k.writer_id')},
owner AS (
  SELECT o.key, o.fence_key, o.token, ${ETAG_SQL('o')} AS etag, i.fence_key AS named_fence_key
  FROM input i JOIN fence ON ${passes('i')} JOIN fencepost.objects o ON o.key = i.key
  WHERE i.kind = 'delete' OR (i.kind = 'put' AND (o.fence_key <> i.fence_key OR i.if_match IS NOT NULL OR i.if_none_match))
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
unmet AS (
  SELECT i.ord FROM input i LEFT JOIN owner w ON w.key = i.key
  WHERE (i.if_match IS NOT NULL AND (w.key IS NULL OR (i.if_match <> '*' AND w.etag <> ALL (string_to_array(i.if_match, ' ')))))
    OR (i.if_none_match AND w.key IS NOT NULL)
),
put AS (
  INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  SELECT i.key, i.fence_key, i.token, 1, i.content_type, i.body
  FROM input i JOIN fence ON ${passes('i')}
  WHERE i.kind = 'put' AND NOT EXISTS (SELECT 1 FROM unmet u WHERE u.ord = i.ord) ORDER BY i.key
  ON CONFLICT (key) DO UPDATE
    SET fence_key = EXCLUDED.fence_key, token = EXCLUDED.token, version = o.version + 1,
        content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
    WHERE (o.fence_key = EXCLUDED.fence_key
        OR EXISTS (SELECT 1 FROM guard g WHERE g.key = o.key AND g.fence_key = o.fence_key AND g.need <= EXCLUDED.token))
      AND NOT EXISTS (SELECT 1 FROM input x WHERE x.key = o.key AND x.kind = 'put' AND x.if_none_match)
  RETURNING o.key, o.version, ${ETAG_SQL('o')} AS etag
),
del AS (
  DELETE FROM fencepost.objects o
  USING input i JOIN fence ON ${passes('i')} LEFT JOIN guard g ON g.key = i.key
  WHERE i.kind = 'delete' AND o.key = i.key
    AND (o.fence_key = i.fence_key OR (g.fence_key = o.fence_key AND g.need <= i.token))
    AND fencepost.object_fence_ok(i.key, i.fence_key)
    AND NOT EXISTS (SELECT 1 FROM unmet u WHERE u.ord = i.ord)
  RETURNING o.key
),
applied AS (
  SELECT i.ord, i.kind, i.key, i.token, i.if_none_match, i.fence_key, fence.highest_token, put.version, put.etag,
    fence.fence_key IS NOT NULL AND CASE i.kind
      WHEN 'put' THEN put.key IS NULL
      WHEN 'delete' THEN del.key IS NULL
        AND (EXISTS (SELECT 1 FROM owner w WHERE w.key = i.key) OR EXISTS (SELECT 1 FROM unmet u WHERE u.ord = i.ord))
      ELSE false END AS unapplied
  FROM input i
  LEFT JOIN fence ON ${passes('i')}
  LEFT JOIN put ON i.kind = 'put' AND put.key = i.key
  LEFT JOIN del ON i.kind = 'delete' AND del.key = i.key
),
result AS (
  SELECT a.*, a.unapplied
    AND NOT EXISTS (SELECT 1 FROM guard g WHERE g.key = a.key AND g.need > a.token)
    AND (EXISTS (SELECT 1 FROM unmet u WHERE u.ord = a.ord) OR (a.kind = 'put' AND a.if_none_match)) AS precondition_failed
  FROM applied a
),
counted AS (
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, accepted)
  SELECT fence_key, ${SHARD}, count(*) FROM result WHERE highest_token IS NOT NULL AND NOT unapplied
  GROUP BY fence_key ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET accepted = c.accepted + EXCLUDED.accepted
),
totalled AS (
  INSERT INTO fencepost.totals AS t (shard, fences, accepted)
  SELECT ${SHARD}, (SELECT count(*) FROM raised WHERE created), count(*) FROM result WHERE highest_token IS NOT NULL AND NOT unapplied
  ON CONFLICT (shard) DO UPDATE SET fences = t.fences + EXCLUDED.fences, accepted = t.accepted + EXCLUDED.accepted
)
SELECT ord, highest_token, version, etag, unapplied AND NOT precondition_failed AS object_refused, precondition_failed
FROM result ORDER BY ord`,
    values: [...writeValues(rows), ...preconditionValues(rows), rows.map((r) => r.writerId ?? null), ...bodyOffsets(rows)],
  };
}

/** A put fencedPuts can carry: no If-Match, no If-None-Match. */
export function isPlainPut(r: WriteRow): boolean {
  return r.kind === 'put' && (r.ifMatch === undefined || r.ifMatch === null) && r.ifNoneMatch !== true;
}

/**
 * The leader's common case, cheaper than fencedWrite (about half its cost to Postgres): plain puts
 * (isPlainPut) whose fence is at their very token, on objects of that fence or new ones: the rule's
 * share step alone (rule.ts shareFences, exactly the token), then the objects. Returns a row only for
 * each put it applied, with its version and
 * ETag; every other put (its fence absent, lower or higher: a raise or a stale token; its object
 * under another fence: the object rule) was left untouched and goes to fencedWrite, which decides
 * it. Each applied put is counted by a row in pending_counts (an insert: a quarter cheaper than
 * upserting a counter row per fence), which the count reads add and the proxy folds
 * (foldPendingCounts).
 */
export function fencedPuts(rows: readonly WriteRow[]): Query {
  return {
    name: 'fencepost_fenced_puts',
    text: `
WITH input AS (
  SELECT t.ord, t.fence_key, t.key, t.token, t.content_type,
    ${bodyOf('$6', 't')} AS body
  FROM unnest($1::int[], $2::text[], $3::text[], $4::bigint[], $5::text[], $7::int[], $8::int[])
    AS t(ord, fence_key, key, token, content_type, body_start, body_length)
),
held AS (
  ${shareFences('(SELECT DISTINCT fence_key, token FROM input)', '=')}
),
put AS (
  INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  SELECT i.key, i.fence_key, i.token, 1, i.content_type, i.body
  FROM input i JOIN held h ON h.fence_key = i.fence_key AND h.highest_token = i.token
  ORDER BY i.key
  ON CONFLICT (key) DO UPDATE
    SET token = EXCLUDED.token, version = o.version + 1, content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
    WHERE o.fence_key = EXCLUDED.fence_key
  RETURNING o.key, o.fence_key, o.token, o.version, ${ETAG_SQL('o')} AS etag
),
counted AS (
  INSERT INTO fencepost.pending_counts (fence_key) SELECT fence_key FROM put
)
SELECT i.ord, p.token AS highest_token, p.version, p.etag FROM input i JOIN put p ON p.key = i.key ORDER BY i.ord`,
    values: [
      rows.map((_, i) => i),
      rows.map((r) => r.fenceKey),
      rows.map((r) => r.key),
      rows.map((r) => r.token.toString()),
      rows.map((r) => r.contentType),
      concatenatedBodies(rows),
      ...bodyOffsets(rows),
    ],
  };
}

/**
 * The bodies of a batch as one bytea, each row's at its 1-based start for its length (bodyOffsets;
 * null for no body): node-postgres sends a Buffer in binary, so Postgres parses nothing, where it parsed an array literal of them
 * character by character (array_in was 7 % of its CPU on the leader's object writes).
 */
function concatenatedBodies(rows: readonly WriteRow[]): Buffer {
  return Buffer.concat(rows.flatMap((r) => (r.body === null ? [] : [r.body])));
}

/** SQL: row `t`'s body out of the bytea parameter `param` (columns body_start, body_length). */
export function bodyOf(param: string, t: string): string {
  return `CASE WHEN ${t}.body_length IS NOT NULL THEN substring(${param}::bytea FROM ${t}.body_start FOR ${t}.body_length) END`;
}

/** Each row's body_start and body_length in concatenatedBodies (null: no body). */
export function bodyOffsets(rows: readonly WriteRow[]): [(number | null)[], (number | null)[]] {
  const starts: (number | null)[] = [];
  const lengths: (number | null)[] = [];
  let at = 1;
  for (const r of rows) {
    starts.push(r.body === null ? null : at);
    lengths.push(r.body === null ? null : r.body.length);
    at += r.body?.length ?? 0;
  }
  return [starts, lengths];
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

/**
 * The parameters of a batch, in fencedWrite's order ($1…$7, $7 every body in one bytea); its
 * preconditions follow (preconditionValues, $8 and $9), then the writer ids ($10), then where
 * each body starts in $7 and its length ($11, $12: bodyOffsets).
 */
export function writeValues(rows: readonly WriteRow[]): unknown[] {
  return [
    rows.map((_, i) => i),
    rows.map((r) => r.kind),
    rows.map((r) => r.fenceKey),
    rows.map((r) => r.key),
    rows.map((r) => r.token.toString()),
    rows.map((r) => r.contentType),
    concatenatedBodies(rows),
  ];
}

/**
 * fencedWrite's $8 (If-Match: null, `*`, or the ETags one of which must match, space-separated;
 * tags not of ETAG_FORM can never match and are left out) and $9 (If-None-Match: *).
 */
export function preconditionValues(rows: readonly WriteRow[]): unknown[] {
  return [
    rows.map((r) =>
      r.ifMatch === undefined || r.ifMatch === null ? null : r.ifMatch === '*' ? '*' : r.ifMatch.filter((t) => ETAG_FORM.test(t)).join(' '),
    ),
    rows.map((r) => r.ifNoneMatch === true),
  ];
}

/** Where a rejection was refused: HTTP object writes and fences, POST /v1/transactions, the SQL endpoint. */
export type Door = 'http' | 'transaction' | 'sql';

export interface RejectionRow {
  /** `transaction` for a refused transaction, of POST /v1/transactions or the SQL endpoint (one row per stale fence). */
  kind: OpKind | 'transaction';
  fenceKey: string;
  key: string | null;
  token: bigint;
  writerId: string | null;
}

/**
 * Records operations rejected at `door`: counts them (per fence, in the totals, per minute), logs
 * each one, and returns each fence's highest token as it is now (read after the rejection, as the
 * 409 reports).
 */
export function recordRejections(door: Door, rows: readonly RejectionRow[]): Query {
  return {
    name: 'fencepost_record_rejections',
    text: `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
    AS t(operation, fence_key, key, token, writer_id)
),
counts AS (
  SELECT fence_key, count(*) AS n FROM input GROUP BY fence_key
),
bump AS (
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, rejected)
  SELECT fence_key, ${SHARD}, n FROM counts ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET rejected = c.rejected + EXCLUDED.rejected
),
total AS (
  INSERT INTO fencepost.totals AS t (shard, rejected) SELECT ${SHARD}, sum(n) FROM counts
  ON CONFLICT (shard) DO UPDATE SET rejected = t.rejected + EXCLUDED.rejected
),
per_minute AS (
  INSERT INTO fencepost.rejection_minutes AS m (minute, shard, count) SELECT date_trunc('minute', now()), ${SHARD}, sum(n) FROM counts
  ON CONFLICT (minute, shard) DO UPDATE SET count = m.count + EXCLUDED.count
),
cur AS (
  SELECT f.fence_key, f.highest_token FROM fencepost.fences f JOIN counts c USING (fence_key)
),
log AS (
  INSERT INTO fencepost.rejections (fence_key, object_key, operation, token, highest_token, writer_id, door)
  SELECT i.fence_key, i.key, i.operation, i.token, cur.highest_token, i.writer_id, $6::text
  FROM input i JOIN cur USING (fence_key)
)
SELECT fence_key, highest_token FROM cur`,
    values: [
      rows.map((r) => r.kind),
      rows.map((r) => r.fenceKey),
      rows.map((r) => r.key),
      rows.map((r) => r.token.toString()),
      rows.map((r) => r.writerId),
      door,
    ],
  };
}

export function readObject(key: string): Query {
  return {
    name: 'fencepost_read_object',
    text: `SELECT fence_key, token, version, ${ETAG_SQL('o')} AS etag, content_type, body, updated_at FROM fencepost.objects o WHERE key = $1`,
    values: [key],
  };
}

/**
 * The smallest string above every string that starts with `prefix`, in byte order (UTF-8 byte
 * order is code point order): the prefix with its last code point raised by one, dropping
 * trailing U+10FFFF; null when there is none (every string from the prefix on qualifies).
 */
export function prefixEnd(prefix: string): string | null {
  const points = Array.from(prefix, (c) => c.codePointAt(0)!);
  while (points.length > 0) {
    const last = points.pop()!;
    if (last < 0x10ffff) {
      points.push(last + 1 === 0xd800 ? 0xe000 : last + 1); // no surrogates in UTF-8
      return String.fromCodePoint(...points);
    }
  }
  return null;
}

const byteOrder = (a: string, b: string) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));

/**
 * One page of objects in key order (byte order, whatever the database's collation), walking the
 * index objects_key_bytes (migration 0006) from the cursor: keys after `after` that start with
 * `prefix`, as a range [start, end) of that index so the scan stops at the prefix's end. One named
 * statement per shape of range (from or after a key, with or without an end), so each keeps a
 * plan that starts at its cursor. The body is not read: its size comes from the row.
 */
export function listObjects(prefix: string, after: string | null, limit: number): Query {
  // Past the cursor and at or past the prefix: whichever comes later in byte order.
  const exclusive = after !== null && byteOrder(after, prefix) >= 0;
  const start = exclusive ? after : prefix;
  const end = prefix === '' ? null : prefixEnd(prefix);
  const from = exclusive ? '>' : '>=';
  const below = end === null ? '' : ' AND key COLLATE "C" < $3::text COLLATE "C"';
  return {
    name: `fencepost_list_objects_${exclusive ? 'after' : 'from'}${end === null ? '' : '_below'}`,
    text: `SELECT key, fence_key, token, version, ${ETAG_SQL('o')} AS etag, content_type, octet_length(body) AS size, updated_at
FROM fencepost.objects o WHERE key COLLATE "C" ${from} $1::text COLLATE "C"${below}
ORDER BY key COLLATE "C" LIMIT $2`,
    values: end === null ? [start, limit] : [start, limit, end],
  };
}

/**
 * A fence's counts: the sum of its counter rows (one per fence and backend shard), plus its
 * committed transactions not folded into them yet (PENDING, joined as `p`: pending_counts,
 * migration 0012). One snapshot sees each such transaction either still pending or folded.
 */
const COUNTS = `(coalesce((SELECT sum(c.accepted) FROM fencepost.fence_counts c WHERE c.fence_key = f.fence_key), 0) + coalesce(p.n, 0))::bigint AS accepted,
  coalesce((SELECT sum(c.rejected) FROM fencepost.fence_counts c WHERE c.fence_key = f.fence_key), 0)::bigint AS rejected`;
const PENDING = `LEFT JOIN (SELECT s.fence_key, count(*) AS n FROM fencepost.pending_counts s GROUP BY s.fence_key) p ON p.fence_key = f.fence_key`;

/** Whether the database takes writes: in recovery (a standby), or read-only by default. */
export function writability(): Query {
  return {
    name: 'fencepost_writability',
    text: "SELECT pg_is_in_recovery() AS recovery, current_setting('default_transaction_read_only') AS read_only",
  };
}

/** Postgres's max_connections and the connections it keeps for superusers. */
export function connectionBudget(): Query {
  return {
    name: 'fencepost_connection_budget',
    text: "SELECT current_setting('max_connections')::int AS max, current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved",
  };
}

/** A fence's highest token alone (the forgery guard's question, a raise's aftermath): no counts to add up. */
export function readHighestToken(fenceKey: string): Query {
  return {
    name: 'fencepost_read_highest_token',
    text: 'SELECT highest_token FROM fencepost.fences WHERE fence_key = $1',
    values: [fenceKey],
  };
}

export function readFence(fenceKey: string): Query {
  return {
    name: 'fencepost_read_fence',
    text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM fencepost.fences f ${PENDING} WHERE f.fence_key = $1`,
    values: [fenceKey],
  };
}

/**
 * The fence with the highest token among those whose keys start with `prefix` (an election's
 * fences, GET /v1/elections): where its leader's raise shows. Walks fences_key_bytes over the
 * prefix's range.
 */
export function leadingFence(prefix: string): Query {
  const end = prefix === '' ? null : prefixEnd(prefix);
  return {
    name: end === null ? 'fencepost_leading_fence' : 'fencepost_leading_fence_below',
    text: `SELECT fence_key, highest_token, raised_by, updated_at FROM fencepost.fences
WHERE fence_key COLLATE "C" >= $1::text COLLATE "C"${end === null ? '' : ' AND fence_key COLLATE "C" < $2::text COLLATE "C"'}
ORDER BY highest_token DESC, fence_key COLLATE "C" LIMIT 1`,
    values: end === null ? [prefix] : [prefix, end],
  };
}

/**
 * Keyset paging in fence-key order (byte order, so it is stable whatever the collation), walking
 * the index fences_key_bytes from the cursor. Two statements rather than `$1 IS NULL OR …`, so
 * each keeps a plan that starts at its cursor.
 */
export function listFences(after: string | null, limit: number): Query {
  if (after === null) {
    return {
      name: 'fencepost_list_fences_first',
      text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM (
  SELECT * FROM fencepost.fences ORDER BY fence_key COLLATE "C" LIMIT $1) f ${PENDING} ORDER BY f.fence_key COLLATE "C"`,
      values: [limit],
    };
  }
  return {
    name: 'fencepost_list_fences_after',
    text: `SELECT f.fence_key, f.highest_token, f.updated_at, f.raised_by, ${COUNTS} FROM (
  SELECT * FROM fencepost.fences WHERE fence_key COLLATE "C" > $1::text COLLATE "C" ORDER BY fence_key COLLATE "C" LIMIT $2) f ${PENDING}
ORDER BY f.fence_key COLLATE "C"`,
    values: [after, limit],
  };
}

/**
 * Folds committed writes and transactions into the counters (migration 0012): deletes the rows
 * they left in pending_counts (rows of committed ones only: they commit with them) and adds
 * them to fence_counts and totals, in one statement. Rows another fold holds are skipped, never
 * waited for or counted twice. Counter shards 64–95: no writer's statement or transaction holds
 * them, so a fold never waits for one.
 */
/**
 * The raise of the SQL doors (raise.ts): each fence absent or below its token is inserted or raised
 * to it, in a statement of the proxy's own (its pool forces synchronous_commit on), before the
 * writer's transaction takes the fence at that token. A fence already at or above its token is only
 * read: locked FOR SHARE, as any writer at its token does. Rows: fence_key, highest_token (after).
 */
export function raiseFences(fences: readonly { fenceKey: string; token: bigint }[], writerId: string | null): Query {
  return {
    name: 'fencepost_raise_fences',
    text: `WITH input AS (
  SELECT t.fence_key, t.token FROM unnest($1::text[], $2::bigint[]) AS t(fence_key, token)
),
held AS (
  ${shareFences('input', '>=')}
),
raised AS (
  ${raiseFencesStep('input', '$3', '<')}
),
created AS (
  INSERT INTO fencepost.totals AS t (shard, fences)
  SELECT ${shardSql('transaction')}, count(*) FROM raised WHERE created HAVING count(*) > 0
  ON CONFLICT (shard) DO UPDATE SET fences = t.fences + EXCLUDED.fences
)
SELECT i.fence_key, coalesce(h.highest_token, r.highest_token)::text AS highest_token
FROM input i LEFT JOIN held h ON h.fence_key = i.fence_key LEFT JOIN raised r ON r.fence_key = i.fence_key`,
    values: [fences.map((f) => f.fenceKey), fences.map((f) => f.token.toString()), writerId],
  };
}

/**
 * What holds `fenceKeys` against a raise by backend `raiser`: the backends blocking it, and
 * prepared transactions holding a fence row. The proxy's own role's backends are left alone (other
 * raises, maybe at this very token; statements short and under the lock timeout), known by their
 * login role (`usename`), which nothing a client sets changes.
 */
export function fenceHolders(raiser: number, fenceKeys: readonly string[]): Query {
  return {
    name: 'fencepost_fence_holders',
    text: `SELECT 'backend' AS kind, b.pid::text AS id, a.usename::text AS role FROM unnest(pg_blocking_pids($1)) AS b(pid)
  JOIN pg_stat_activity a ON a.pid = b.pid WHERE b.pid <> 0 AND a.usename IS DISTINCT FROM current_user
UNION
SELECT 'prepared', p.gid, p.owner::text FROM fencepost.fences f JOIN pg_prepared_xacts p ON p.transaction = f.xmax AND p.database = current_database()
  WHERE f.fence_key = ANY($2::text[]) AND 0 = ANY(pg_blocking_pids($1))`,
    values: [raiser, fenceKeys],
  };
}

/** The application_name of a raise's transaction: a label for operators, never a pass (a client can name itself anything). */
export const RAISE_APPLICATION = 'fencepost-raise';

/** The end of a count Query: adds a CTE `per_fence (fence_key, n)` to fence_counts and totals (fold shards). */
const ADD_PER_FENCE_COUNTS = `counted AS (
  INSERT INTO fencepost.fence_counts AS c (fence_key, shard, accepted)
  SELECT fence_key, ${shardSql('fold')}, n FROM per_fence ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key, shard) DO UPDATE SET accepted = c.accepted + EXCLUDED.accepted
)
INSERT INTO fencepost.totals AS t (shard, accepted)
SELECT ${shardSql('fold')}, sum(n) FROM per_fence HAVING count(*) > 0
ON CONFLICT (shard) DO UPDATE SET accepted = t.accepted + EXCLUDED.accepted`;

/** Adds accepted counts (accepted-counts.ts) to the counters, in the fold shards (shards.ts). */
export function addAcceptedCounts(fenceKeys: readonly string[], counts: readonly number[]): Query {
  return {
    text: `
WITH local_commit AS (
  -- A count, not a fence: its commit need not wait for a synchronous standby (which may be down).
  SELECT pg_catalog.set_config('synchronous_commit', 'local', true) AS s
),
per_fence AS (
  SELECT t.fence_key, t.n FROM unnest($1::text[], $2::bigint[]) AS t(fence_key, n), local_commit
),
${ADD_PER_FENCE_COUNTS}`,
    values: [fenceKeys, counts.map(String)],
  };
}

export function foldPendingCounts(): Query {
  return {
    // Unnamed, so planned at each run: a plan cached while the table was empty re-ran the locking
    // subquery for every row (quadratic; 10,000 rows took 5 s). Once a second, planning is cheap.
    text: `
WITH done AS (
  DELETE FROM fencepost.pending_counts s
  WHERE s.ctid IN (SELECT t.ctid FROM fencepost.pending_counts t LIMIT 100000 FOR UPDATE SKIP LOCKED)
  RETURNING s.fence_key
),
per_fence AS (
  SELECT fence_key, count(*) AS n FROM done GROUP BY fence_key
),
${ADD_PER_FENCE_COUNTS}`,
  };
}

/**
 * Totals kept as writes commit (migration 0005): a row per shard, whatever the number of fences,
 * plus the committed transactions not folded yet.
 */
export function statsTotals(): Query {
  return {
    name: 'fencepost_stats_totals',
    text: `SELECT coalesce(sum(fences), 0)::bigint AS fences,
  (coalesce(sum(accepted), 0) + (SELECT count(*) FROM fencepost.pending_counts))::bigint AS accepted,
  coalesce(sum(rejected), 0)::bigint AS rejected
FROM fencepost.totals`,
  };
}

/**
 * Per-fence counts for the ops view: the fences rejected most recently (up to `limit` of them,
 * found by walking the rejection log backwards), most rejected first; then the most recently
 * raised fences, up to `limit` in all. Both lists come from indexes (rejections' primary key,
 * fences_updated_at) and count at most `limit` fences, so the cost does not grow with the tables.
 */
export function statsPerFence(limit: number): Query {
  return {
    name: 'fencepost_stats_per_fence',
    text: `
WITH rejected_keys AS (
  SELECT fence_key FROM (SELECT fence_key, id FROM fencepost.rejections ORDER BY id DESC LIMIT 20 * $1) r
  GROUP BY fence_key ORDER BY max(id) DESC LIMIT $1
),
raised_keys AS (
  SELECT f.fence_key FROM fencepost.fences f
  WHERE NOT EXISTS (SELECT 1 FROM rejected_keys r WHERE r.fence_key = f.fence_key)
  ORDER BY f.updated_at DESC
  LIMIT $1
),
picked AS (
  SELECT fence_key, 0 AS part FROM rejected_keys UNION ALL SELECT fence_key, 1 FROM raised_keys
)
SELECT f.fence_key, f.highest_token, f.raised_by, f.updated_at, ${COUNTS}
FROM picked pk JOIN fencepost.fences f ON f.fence_key = pk.fence_key ${PENDING}
ORDER BY pk.part, rejected DESC, accepted DESC, f.fence_key COLLATE "C"
LIMIT $1`,
    values: [limit],
  };
}

// ---- fenced SQL transactions (src/fence/transaction.ts) ------------------------------------------
// A pooled connection is fenced once per set of (fence key, token) it serves (fenceSession; rule.ts
// session fence); each transaction then carries only the epoch proof (openClientTransaction).

export type Isolation = 'read committed' | 'repeatable read' | 'serializable';

const BEGIN: Record<Isolation, string> = {
  'read committed': 'BEGIN ISOLATION LEVEL READ COMMITTED',
  'repeatable read': 'BEGIN ISOLATION LEVEL REPEATABLE READ',
  serializable: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
};

export { RESET_SESSION };

/**
 * Fences a pooled connection for `fences` (fence key order), in a Query of its own: DISCARD
 * SEQUENCES first (what the connection was fenced for before is forgotten: a transaction of one set
 * of fences never writes with another's), then fence_session() for each, with capabilities bound to
 * this backend (rule.ts sessionFenceCapability). One row per fence, in order: its highest token
 * (null: no fence yet). The session passed each fence whose highest token is its token.
 */
export function fenceSession(fences: readonly { fenceKey: string; token: bigint; capability: string }[]): Query {
  const values: unknown[] = [];
  const calls = fences.map((f, i) => {
    values.push(f.capability, f.fenceKey, f.token.toString());
    return `SELECT ${i} AS ord, fencepost_api.fence_session($${3 * i + 1}, $${3 * i + 2}, $${3 * i + 3}::bigint)::text AS highest_token`;
  });
  return { text: calls.join(' UNION ALL '), values };
}

/**
 * Forgets every fence the connection passed (before it serves another set of fences), with the
 * settings and role an earlier transaction may have left, so fenceSession() runs as the login, and
 * opens the transaction it runs in (endFenceSession). Its last result is one row, `start`: the
 * backend's start (session_start), which the capabilities of fenceSession() are bound to.
 */
export function unfenceSession(): Query {
  return {
    text: 'RESET ALL; SET SESSION AUTHORIZATION DEFAULT; DISCARD SEQUENCES; BEGIN; SET LOCAL synchronous_commit = local; SELECT fencepost_api.session_start() AS start',
  };
}

/**
 * Ends the transaction unfenceSession() opened around fenceSession(): committed locally (a catalog
 * write of the session's, not a fence raise), so it never waits for a synchronous standby.
 */
export function endFenceSession(): Query {
  return { text: 'COMMIT' };
}

/**
 * The first round trip of a fenced transaction on a pooled client-login connection fenced for its
 * fences (fenceSession), one simple Query: reset the session (RESET_SESSION), BEGIN (read-write,
 * whatever the login's defaults say) with the statement and lock timeouts, no bind parameters in
 * error reports and the key's role, then the epoch proof of each fence (prove_epochs, definitions.ts):
 * it fails (55000, XX000) when a raise replaced an epoch since the connection was fenced, and holds
 * each epoch until the transaction ends.
 *
 * Everything spliced is the proxy's own, ASCII only: the isolation from a fixed table, the
 * timeouts validated integers, the role a configured key's pgRole (a plain identifier, quoted), the
 * epoch sequences' names (hex).
 */
export function openClientTransaction(
  isolation: Isolation,
  statementTimeoutMs: number,
  lockTimeoutMs: number,
  role: string | null,
  fenceKeys: readonly string[],
): Query {
  if (!Number.isSafeInteger(statementTimeoutMs) || !Number.isSafeInteger(lockTimeoutMs)) throw new Error('timeouts must be integers');
  if (role !== null && !ROLE_NAME.test(role)) throw new Error('role must be a plain identifier');
  if (fenceKeys.length === 0) throw new Error('a fenced transaction needs a fence');
  const setRole = role === null ? '' : `; SET LOCAL ROLE "${role}"`;
  const epochs = fenceKeys.map((k) => `'${epochSequence(k)}'`).join(', ');
  return {
    text:
      `${RESET_SESSION}${BEGIN[isolation]} READ WRITE; SET LOCAL statement_timeout = ${statementTimeoutMs}; SET LOCAL lock_timeout = ${lockTimeoutMs}; SET LOCAL log_parameter_max_length_on_error = 0${setRole}; ` +
      `SELECT fencepost_api.prove_epochs(ARRAY[${epochs}])`,
  };
}

/**
 * The last round trip, one simple Query with nothing the writer can shadow: close every cursor (a
 * WITH HOLD cursor's query would run inside COMMIT), fire every deferred trigger now, stop
 * listening and release session advisory locks (nothing of the session stays active while the
 * connection waits in the pool; the rest is reset by the next transaction), force durability on,
 * then COMMIT. A statement that ended the transaction is caught before (transaction.ts: its
 * command tag, or the block state).
 */
export function sealAndCommit(): Query {
  return {
    text: 'SET LOCAL log_parameter_max_length_on_error = 0; CLOSE ALL; SET CONSTRAINTS ALL IMMEDIATE; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); SET LOCAL synchronous_commit = on; COMMIT',
  };
}

export function terminateBackend(pid: number): Query {
  return { text: 'SELECT pg_terminate_backend($1)', values: [pid] };
}

/** ROLLBACK, and the session advisory locks a statement took (not transactional) released. */
export function rollbackTransaction(): Query {
  return { text: 'ROLLBACK; SELECT pg_catalog.pg_advisory_unlock_all()' };
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

/**
 * Backends waiting this long or longer for a synchronous standby to confirm their commit
 * (wait_event SyncRep): written here, not yet acknowledged. A commit waits so briefly on a healthy
 * standby that a shorter wait is not counted. Without pg_read_all_stats, other roles' backends
 * read a null wait_event and are not counted.
 */
export function syncRepWaiters(minWaitMs: number): Query {
  return {
    text: `SELECT count(*)::int AS waiting FROM pg_stat_activity
WHERE wait_event_type = 'IPC' AND wait_event = 'SyncRep' AND clock_timestamp() - coalesce(query_start, backend_start) >= make_interval(secs => $1::float8 / 1000)`,
    values: [minWaitMs],
  };
}

/**
 * Prepared transactions that are the single locker of a fence row (its xmax), for a raise that hit
 * the lock timeout (prepared-holders.ts).
 */
export function preparedFenceHolders(fenceKeys: readonly string[]): Query {
  return {
    text: `SELECT f.fence_key, p.gid, f.xmax::text AS xmax, (p.gid IS NOT NULL) AS direct
FROM fencepost.fences f LEFT JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = f.xmax
WHERE f.fence_key = ANY($1::text[]) AND f.xmax <> '0'::xid
ORDER BY f.fence_key COLLATE "C", p.prepared`,
    values: [fenceKeys],
  };
}

/**
 * Prepared transactions among the lockers of a MultiXactId (a row share-locked by several
 * transactions). Fails when `xmax` is no MultiXactId (the caller asks only after the single-locker
 * check found none, and treats a failure as "none").
 */
export function preparedMultiXactHolders(xmax: string): Query {
  return {
    text: `SELECT p.gid FROM pg_catalog.pg_get_multixact_members($1::text::xid) m
JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = m.xid ORDER BY p.prepared`,
    values: [xmax],
  };
}
