// The object store's statements: the fenced write (and its plain-put fast path), object reads and
// listings, and the fences of objects.
import type { Query } from './query.ts';
import { fenceCtes, shareStep } from './rule.ts';
import { shardSql } from '../shards.ts';

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
 * share step alone (rule.ts shareStep, exactly the token), then the objects. Returns a row only for
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
  ${shareStep('(SELECT DISTINCT fence_key, token FROM input)', '=')}
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
