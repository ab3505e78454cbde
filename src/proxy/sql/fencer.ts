// The connection fence of the SQL endpoint (rule.ts): once, at startup, before the writer hears
// its session is ready, the fencer decides from the startup settings (fencepost.token and
// fencepost.fence_key, in `options` or as the driver's own startup parameters) what the
// connection is:
// - no token: unfenced (its backend starts read-only; protected tables refuse it in Postgres);
// - malformed settings, or a fence key outside the key's prefixes: refused (FP400, 42501);
// - a guarded fence key whose token the forgery guard does not admit: refused (FP409 unverified,
//   FP503 when ZooKeeper could not be asked);
// - otherwise fence_session on the connection's own backend: at the fence's highest token it is
//   fenced; above it, stale (FP409); absent or below, the fence is raised to the token
//   (src/fence/raise.ts, a transaction of the proxy's own) and the connection fenced again.
// A refusal is the writer's answer to its startup, an ErrorResponse it shows with its SQLSTATE.
// Nothing is decided after startup: a newer leader's raise ends the connection (the database does).
import type { Logger } from 'pino';
import {
  keyProblem,
  MAX_KEY_BYTES,
  FenceHeldByPreparedError,
  GUARD_UNAVAILABLE,
  INVALID_FENCE_SETTING,
  RAISE_FIRST,
  STALE_TOKEN,
  DURABILITY_UNSAFE,
  staleDetailText,
  unverifiedDetailText,
  INSUFFICIENT_PRIVILEGE,
  MAX_TOKEN,
  parseToken,
} from '../../fence/index.ts';
import type { ErrorFields } from './wire/backend.ts';
import type { BackendAnswer } from './backend.ts';
import { withinPrefixes } from '../access/keys.ts';

/** The forgery guard, as the session uses it (src/proxy/forgery-guard.ts). */
export interface SessionGuard {
  /** Is this fence key guarded? */
  guards(fenceKey: string): boolean;
  /** Resolves when (fenceKey, token) may raise the fence; throws an ApiError (`unverified_token`, `unavailable`) when not. */
  admit(fenceKey: string, token: bigint): Promise<void>;
}

/** fencepost.token and fencepost.fence_key from the startup settings (null: not given). */
export interface FenceSettings {
  token: string | null;
  fenceKey: string | null;
}

export interface FencePair {
  fenceKey: string;
  token: bigint;
}

/** A stale token refused: counted and logged as every door's refusals are. */
export interface StaleRefusal {
  fenceKey: string;
  token: bigint;
  highestToken: bigint | null;
}

/** What the connection is, once decided. */
export type ConnectionFence =
  | { kind: 'unfenced' }
  | { kind: 'fenced'; pair: FencePair }
  | {
      kind: 'refused';
      error: ErrorFields;
      /** A stale token (a rejection, counted as every door's). */
      stale?: StaleRefusal;
      /** Counted as the HTTP door counts its answers: the fence could not be checked (`error`), or malformed settings (`invalid`). */
      outcome?: 'error' | 'invalid';
    };

export interface FencerOptions {
  /** The forgery guard; null: none. */
  guard: SessionGuard | null;
  /** The key's fence-key prefixes; null in open mode (any fence key). */
  prefixes: readonly string[] | null;
  /** Raises the fence to the token where it is absent or below (raise.ts); throws when it could not. */
  raise: (fenceKey: string, token: bigint) => Promise<void>;
  /** Writes are refused now (FENCEPOST_REQUIRE_SYNC_STANDBY, src/fence/durability-monitor.ts). */
  refusing: () => boolean;
  /** A Query of the proxy's on the connection's backend, before any message of the writer's. */
  query: (sql: string) => Promise<BackendAnswer>;
  /** The SQL that sets the backend up (fencepost_api.session_start): one value, the backend's start. */
  setupSql: string;
  /** The SQL that fences the backend for `pair` (fence_session with a capability bound to the backend and `start`). */
  fenceSql: (pair: FencePair, start: string) => string;
  logger: Logger;
}

/** A fencepost.token is at most 19 digits (MAX_TOKEN) after leading zeros (a ZooKeeper sequence suffix keeps them). */
export const MAX_TOKEN_CHARS = 64;
/** Client text quoted into a refusal or a log line: at most this many characters of it. */
const QUOTED_CHARS = 64;

/** `value` as JSON, cut to QUOTED_CHARS characters with a note of its whole length. */
export function quoteBounded(value: string, bytes = Buffer.byteLength(value, 'utf8')): string {
  if (value.length <= QUOTED_CHARS && bytes === Buffer.byteLength(value, 'utf8')) return JSON.stringify(value);
  return `${JSON.stringify(value.slice(0, QUOTED_CHARS))}… (${bytes} bytes)`;
}

const refusal = (code: string, message: string, detail?: string, hint?: string): ErrorFields => ({
  severity: 'FATAL',
  code,
  message,
  ...(detail !== undefined ? { detail } : {}),
  ...(hint !== undefined ? { hint } : {}),
});

const RETRY_HINT = 'nothing was applied; connect again';

/** The settings' pair, or why they are refused (null: no token, an unfenced connection). */
export function settingsPair(s: FenceSettings, prefixes: readonly string[] | null): FencePair | null | ErrorFields {
  if (s.token === null || s.token === '') return null;
  // Sizes first: nothing of an oversized value is parsed or quoted.
  const tokenBytes = Buffer.byteLength(s.token, 'utf8');
  if (tokenBytes > MAX_TOKEN_CHARS) {
    return refusal(
      INVALID_FENCE_SETTING,
      `fencepost.token is too long: ${tokenBytes} bytes, a token is at most 19 digits (0 to ${MAX_TOKEN}, at most ${MAX_TOKEN_CHARS} characters with leading zeros)`,
    );
  }
  const fenceKeyBytes = s.fenceKey === null ? 0 : Buffer.byteLength(s.fenceKey, 'utf8');
  if (fenceKeyBytes > MAX_KEY_BYTES) {
    return refusal(
      INVALID_FENCE_SETTING,
      `fencepost.fence_key is too long: ${fenceKeyBytes} bytes, a fence key is at most ${MAX_KEY_BYTES} bytes`,
    );
  }
  const parsed = parseToken(s.token);
  if (!parsed.ok)
    return refusal(INVALID_FENCE_SETTING, `fencepost.token must be decimal digits, 0 to ${MAX_TOKEN}, got ${quoteBounded(s.token)}`);
  if (s.fenceKey === null || s.fenceKey === '') {
    return refusal(
      INVALID_FENCE_SETTING,
      'fencepost.token is set but fencepost.fence_key is not',
      undefined,
      'connect with -c fencepost.fence_key=… next to -c fencepost.token=… in the startup options',
    );
  }
  const problem = keyProblem(s.fenceKey);
  if (problem !== null) return refusal(INVALID_FENCE_SETTING, `fencepost.fence_key ${problem}`);
  if (!withinPrefixes(prefixes, s.fenceKey)) {
    return refusal(
      INSUFFICIENT_PRIVILEGE,
      `this key may not write fence key ${quoteBounded(s.fenceKey)}: it is outside its fence-key prefixes`,
    );
  }
  return { fenceKey: s.fenceKey, token: parsed.token };
}

/** The refusal of a stale token (a newer leader holds the fence). */
export function staleRefusal(pair: FencePair, highest: bigint): ConnectionFence {
  const { fenceKey, token } = pair;
  return {
    kind: 'refused',
    stale: { fenceKey, token, highestToken: highest },
    error: refusal(
      STALE_TOKEN,
      `stale fencing token: token ${token} is below the highest token ${highest} of fence key ${JSON.stringify(fenceKey)}`,
      staleDetailText(fenceKey, token, highest),
      "a newer leader holds this fence: this connection may not write; connect with the current leader's token",
    ),
  };
}

/** The refusal of every write while a failover could lose a fence raise. */
export function durabilityRefusal(): ErrorFields {
  return refusal(
    DURABILITY_UNSAFE,
    'writes are refused: no synchronous standby streams, and FENCEPOST_REQUIRE_SYNC_STANDBY is set',
    undefined,
    'a failover now could lose a fence raise; nothing was applied; connect again once a synchronous standby streams',
  );
}

/** Decides the connection's fence from its startup settings, on its backend (see the top of this file). */
export async function fenceConnection(settings: FenceSettings, opts: FencerOptions): Promise<ConnectionFence> {
  const pair = settingsPair(settings, opts.prefixes);
  if (pair === null) return { kind: 'unfenced' };
  if (!('token' in pair)) return { kind: 'refused', error: pair, outcome: 'invalid' };
  if (opts.refusing()) return { kind: 'refused', error: durabilityRefusal(), outcome: 'error' };
  const { fenceKey, token } = pair;
  const setup = await opts.query(opts.setupSql);
  const start = setup.rows[0]?.[0] ?? '';
  if (setup.error !== null || start === '') {
    opts.logger.warn({ failure: setup.error?.get('M') }, 'could not set the SQL connection up; it is refused');
    return couldNotFence(pair, setup.error);
  }
  const fence = async (): Promise<{ highest: bigint | null } | ConnectionFence> => {
    const r = await opts.query(opts.fenceSql(pair, start));
    if (r.error !== null) {
      opts.logger.warn({ fenceKey, token: token.toString(), failure: r.error.get('M') }, 'could not fence the SQL connection');
      return couldNotFence(pair, r.error);
    }
    const h = r.rows[0]?.[0] ?? '';
    return { highest: h === '' ? null : BigInt(h) };
  };
  let r = await fence();
  if (!('highest' in r)) return r;
  if (r.highest !== null && r.highest >= token) return r.highest === token ? { kind: 'fenced', pair } : staleRefusal(pair, r.highest);
  // A new leader's first connection: the fence is absent or below its token.
  const guard = opts.guard;
  if (guard !== null && guard.guards(fenceKey)) {
    const verdict = await guard.admit(fenceKey, token).then(
      () => 'verified' as const,
      (err: unknown) => ((err as { code?: string }).code === 'unavailable' ? ('unavailable' as const) : ('refused' as const)),
    );
    if (verdict !== 'verified') {
      opts.logger.info(
        { fenceKey, token: token.toString(), unavailable: verdict === 'unavailable' },
        "forgery guard did not admit the connection's token",
      );
      const detail = unverifiedDetailText(fenceKey, token, r.highest);
      if (verdict === 'unavailable') {
        return {
          kind: 'refused',
          outcome: 'error',
          error: refusal(
            GUARD_UNAVAILABLE,
            `cannot verify fencing token ${token} of fence key ${JSON.stringify(fenceKey)}: ZooKeeper unreachable`,
            detail,
            "the forgery guard could not ask ZooKeeper whether this token is the current leader's; nothing was applied, connect again",
          ),
        };
      }
      return {
        kind: 'refused',
        stale: { fenceKey, token, highestToken: r.highest },
        error: refusal(
          STALE_TOKEN,
          `unverified fencing token: token ${token} would raise fence key ${JSON.stringify(fenceKey)} but is not the current leader's`,
          detail,
          "the forgery guard did not verify this token as the sequence of the current leader's election node; nothing was applied",
        ),
      };
    }
  }
  let raiseFailed = false;
  try {
    await opts.raise(fenceKey, token);
  } catch (err) {
    raiseFailed = true;
    // A prepared transaction holding the fence row is named (raise.ts): only an operator ends it.
    const preparedTransaction = err instanceof FenceHeldByPreparedError ? err.preparedTransaction : undefined;
    opts.logger.warn(
      {
        fenceKey,
        token: token.toString(),
        err: (err as Error).message,
        ...(preparedTransaction !== undefined ? { preparedTransaction } : {}),
      },
      'could not raise the fence of an SQL connection; it is refused (FP428)',
    );
  }
  r = await fence();
  if (!('highest' in r)) return r;
  if (r.highest !== null && r.highest >= token) return r.highest === token ? { kind: 'fenced', pair } : staleRefusal(pair, r.highest);
  return {
    kind: 'refused',
    outcome: 'error',
    error: refusal(
      RAISE_FIRST,
      `fence ${JSON.stringify(fenceKey)} could not be raised to token ${token}${raiseFailed ? '' : ' (raised meanwhile by another token?)'}`,
      undefined,
      RETRY_HINT,
    ),
  };
}

/** fence_session or the setup failed: its own SQLSTATE (55P03, 40001, 57014, …), which drivers' retry logic knows. */
function couldNotFence(pair: FencePair, error: Map<string, string> | null): ConnectionFence {
  return {
    kind: 'refused',
    outcome: 'error',
    error: refusal(
      error?.get('C') ?? RAISE_FIRST,
      `could not fence this connection at token ${pair.token} of fence key ${JSON.stringify(pair.fenceKey)}: ${error?.get('M') ?? 'no answer'}`,
      undefined,
      RETRY_HINT,
    ),
  };
}
