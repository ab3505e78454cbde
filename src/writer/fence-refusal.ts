// A fence's refusal, recognised in whatever a writer caught. The SQL endpoint refuses with SQLSTATE
// FP409 and the fence's numbers in the ErrorResponse's DETAIL, in a fixed form; each Postgres
// library hands that error on in a shape of its own: as the error itself (pg, Knex, Kysely,
// TypeORM, MikroORM, postgres.js, pg-boss), as `cause` (Drizzle), `parent` and `original`
// (Sequelize), or as `meta.driverAdapterError.cause` with `originalCode` (Prisma, behind its P2039).
// The HTTP door refuses with a JSON body `{ error: 'stale_token', fenceKey, token, highestToken }`,
// which ProxyClient throws as a StaleTokenError.
//
// Like ProxyClient with the HTTP bodies, this reads the wire and imports nothing of the fence (a
// writer does not load the proxy's SQL): the code and the DETAIL's form are the fence's
// (src/fence/codes.ts, src/proxy/sql/fencer.ts), and test/writer/fence-refusal.test.ts keeps them in step.

/** The SQL endpoint's SQLSTATE for a stale or unverified token. */
const SQL_STALE_TOKEN = 'FP409';
/** HTTP's registry code for a stale token (src/proxy/errors.ts). */
const HTTP_STALE_TOKEN = 'stale_token';
/** An FP409's DETAIL: `fence key "<JSON>", token <n>, highest token <n, or nothing>`, the forgery guard's after a prefix. */
const DETAIL = /^(?:unverified token: )?fence key ("(?:[^"\\]|\\.)*"), token (\d+), highest token (\d*)$/;

export interface FenceRefusal {
  /** `FP409` from the SQL endpoint, `stale_token` from the HTTP door. */
  code: typeof SQL_STALE_TOKEN | typeof HTTP_STALE_TOKEN;
  /** The refusal's fence key, token and highest token; null where the error lost its DETAIL. */
  fenceKey: string | null;
  token: bigint | null;
  /** Null also for an unverified token on a fence that was never raised. */
  highestToken: bigint | null;
}

/** How deep the wrappers go at most: Prisma's is the deepest, at three. */
const MAX_DEPTH = 6;

type Node = Record<string, unknown>;

const isNode = (v: unknown): v is Node => typeof v === 'object' && v !== null;

/** What a node wraps, in the places the libraries put it. */
function wrapped(node: Node): unknown[] {
  const meta = node.meta;
  const adapterError = isNode(meta) ? meta.driverAdapterError : undefined;
  return [node.cause, node.parent, node.original, node.driverError, isNode(adapterError) ? adapterError.cause : undefined];
}

const bigintOf = (v: unknown): bigint | null => {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'string' && /^\d+$/.test(v)) return BigInt(v);
  return null;
};

/** The fence key, token and highest token of an FP409's DETAIL; null for any other text. */
function detailFields(detail: unknown): Pick<FenceRefusal, 'fenceKey' | 'token' | 'highestToken'> | null {
  const m = typeof detail === 'string' ? DETAIL.exec(detail) : null;
  if (m === null) return null;
  let fenceKey: unknown;
  try {
    fenceKey = JSON.parse(m[1]!);
  } catch {
    return null;
  }
  if (typeof fenceKey !== 'string') return null;
  return { fenceKey, token: BigInt(m[2]!), highestToken: m[3] ? BigInt(m[3]) : null };
}

/** This node's own refusal, without looking into what it wraps. */
function refusalOf(node: Node): FenceRefusal | null {
  if (node.code === SQL_STALE_TOKEN || node.originalCode === SQL_STALE_TOKEN) {
    return { code: SQL_STALE_TOKEN, fenceKey: null, token: null, highestToken: null, ...detailFields(node.detail) };
  }
  // The HTTP door's body (`error`), or a StaleTokenError (`code`, its fields already bigint).
  if ((node.error === HTTP_STALE_TOKEN || node.code === HTTP_STALE_TOKEN) && typeof node.fenceKey === 'string') {
    return { code: HTTP_STALE_TOKEN, fenceKey: node.fenceKey, token: bigintOf(node.token), highestToken: bigintOf(node.highestToken) };
  }
  return null;
}

/**
 * The fence's refusal in `err` or in what it wraps (`cause`, `parent`, `original`, `driverError`,
 * `meta.driverAdapterError.cause`), or null when it holds none. A refusal means: a newer leader
 * holds the fence; step down, or connect (a new pool) with the new leader's token.
 */
export function fenceRefusal(err: unknown): FenceRefusal | null {
  const seen = new Set<Node>();
  let level: unknown[] = [err];
  for (let depth = 0; depth <= MAX_DEPTH && level.length > 0; depth++) {
    const next: unknown[] = [];
    for (const v of level) {
      if (!isNode(v) || seen.has(v)) continue;
      seen.add(v);
      const found = refusalOf(v);
      if (found !== null) return found;
      next.push(...wrapped(v));
    }
    level = next;
  }
  return null;
}
