// Broken ways to write a batch, for proving that the checkers catch a broken fence and for the
// benchmark's unfenced baseline. Handed to FenceStore through its test seam (__test__writeStrategy)
// by `tools/cli.ts serve --fence-mode …`; nothing in src/ can reach them.
//   off       no fence at all: objects are written whatever the token
//   two-step  the classic race: read the fence in one statement, write in another, no lock between
import { bodyOf, bodyOffsets, writeValues, type WriteRow } from '../src/fence/sql/objects.ts';
import type { Query } from '../src/fence/sql/query.ts';
import type { WriteOutcome, WriteStrategy } from '../src/fence/store.ts';

export type FenceMode = 'strict' | 'off' | 'two-step';
export const FENCE_MODES: readonly FenceMode[] = ['strict', 'off', 'two-step'];

const INPUT = `input AS (
  SELECT t.ord, t.kind, t.fence_key, t.key, t.token, t.content_type, ${bodyOf('$7', 't')} AS body
  FROM unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $8::int[], $9::int[])
    AS t(ord, kind, fence_key, key, token, content_type, body_start, body_length)
)`;

const OBJECT_WRITES = `put AS (
  INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  SELECT key, fence_key, token, 1, content_type, body FROM input WHERE kind = 'put' ORDER BY key
  ON CONFLICT (key) DO UPDATE
    SET fence_key = EXCLUDED.fence_key, token = EXCLUDED.token, version = o.version + 1,
        content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
  RETURNING o.key, o.version
),
del AS (
  DELETE FROM fencepost.objects o USING input i WHERE i.kind = 'delete' AND o.key = i.key RETURNING o.key
)`;

/** Objects written with no fence check; fences untouched. */
function unfencedWrite(rows: readonly WriteRow[]): Query {
  return {
    name: 'fencepost_unsafe_unfenced_write',
    text: `WITH ${INPUT}, ${OBJECT_WRITES}
SELECT i.ord, i.token::text AS highest_token, put.version FROM input i LEFT JOIN put ON i.kind = 'put' AND put.key = i.key ORDER BY i.ord`,
    values: [...writeValues(rows), ...bodyOffsets(rows)],
  };
}

/** Objects written and fences raised to the batch's tokens, with no check: the second step. */
function uncheckedWrite(rows: readonly WriteRow[]): Query {
  return {
    name: 'fencepost_unsafe_unchecked_write',
    text: `WITH ${INPUT},
fence AS (
  INSERT INTO fencepost.fences AS f (fence_key, highest_token)
  SELECT fence_key, max(token) FROM input GROUP BY fence_key ORDER BY fence_key COLLATE "C"
  ON CONFLICT (fence_key) DO UPDATE SET highest_token = GREATEST(f.highest_token, EXCLUDED.highest_token)
  RETURNING f.fence_key
), ${OBJECT_WRITES}
SELECT i.ord, i.token::text AS highest_token, put.version FROM input i LEFT JOIN put ON i.kind = 'put' AND put.key = i.key ORDER BY i.ord`,
    values: [...writeValues(rows), ...bodyOffsets(rows)],
  };
}

const off: WriteStrategy = (run, rows) => run<WriteOutcome>(unfencedWrite(rows));

const twoStep: WriteStrategy = async (run, rows) => {
  const found = await run<{ fence_key: string; highest_token: string }>({
    text: 'SELECT fence_key, highest_token FROM fencepost.fences WHERE fence_key = ANY($1::text[])',
    values: [[...new Set(rows.map((r) => r.fenceKey))]],
  });
  const highest = new Map(found.map((r) => [r.fence_key, BigInt(r.highest_token)]));
  const pass = rows.map((r, i) => ({ r, i })).filter(({ r }) => r.token >= (highest.get(r.fenceKey) ?? -1n));
  const written = pass.length > 0 ? await run<WriteOutcome>(uncheckedWrite(pass.map((p) => p.r))) : [];
  return rows.map((_, i) => {
    const k = pass.findIndex((p) => p.i === i);
    const w = k < 0 ? undefined : written.find((x) => x.ord === k);
    return { ord: i, highest_token: w?.highest_token ?? null, version: w?.version ?? null };
  });
};

/** The strategy of a mode; undefined for `strict` (the product's own). */
export function unsafeStrategy(mode: FenceMode): WriteStrategy | undefined {
  return mode === 'off' ? off : mode === 'two-step' ? twoStep : undefined;
}
