// The connection fence of the SQL endpoint (rule.ts, definitions.ts fence_session): once, at
// startup, before the writer hears its session is ready, decided here from the startup settings
// (fencepost.token and fencepost.fence_key):
// - no token: unfenced (its backend starts read-only; protected tables refuse it in Postgres);
// - malformed settings, or a fence key the key may not write: refused;
// - a guarded fence key whose token the forgery guard does not admit: refused;
// - otherwise fence_session on the connection's own backend: at the fence's highest token it is
//   fenced; above it, stale; absent or below, the fence is raised to the token (Fence.raise, a
//   transaction of the proxy's own) and the connection fenced again.
// A refusal is data (SessionRefusal); the endpoint words it for the writer (src/proxy/sql/fencer.ts).
// Nothing is decided after startup: a newer leader's raise ends the connection (the database does).
import type { Logger } from 'pino';
import { parseToken, MAX_TOKEN } from './token.ts';
import { keyProblem, MAX_KEY_BYTES } from './key.ts';
import { FenceHeldByPreparedError } from './errors.ts';
import { connectionSetup, fenceConnection } from './sql/connection-fence.ts';
import type { RaiseLogger } from './raise.ts';

/** fencepost.token and fencepost.fence_key from the startup settings (null: not given). */
export interface FenceSettings {
  token: string | null;
  fenceKey: string | null;
}

export interface FencePair {
  fenceKey: string;
  token: bigint;
}

/** The forgery guard, as the session fence uses it (src/proxy/forgery-guard.ts). */
export interface SessionGuard {
  /** Is this fence key guarded? */
  guards(fenceKey: string): boolean;
  /** Resolves when (fenceKey, token) may raise the fence; rejects (`code: 'unavailable'`: ZooKeeper could not be asked). */
  admit(fenceKey: string, token: bigint): Promise<void>;
}

/** The connection's own backend, before the writer's first message: one simple Query at a time. */
export interface SessionBackend {
  pid: number;
  /** The first column of each row as text, or Postgres's error. */
  query(sql: string): Promise<{ rows: string[]; error: { code: string | null; message: string | null } | null }>;
}

export interface SessionRequest {
  settings: FenceSettings;
  /** May the connection's key write this fence key? (its fence-key prefixes) */
  mayWrite: (fenceKey: string) => boolean;
  /** The forgery guard; null: none. */
  guard: SessionGuard | null;
  /** Writes are refused now (FENCEPOST_REQUIRE_SYNC_STANDBY, durability-monitor.ts). */
  refusing: boolean;
  /** The fence capability (client-logins.ts provisioning). */
  capability: string;
  /** The writer, for the raise's record. */
  writerId: string | null;
  logger: Logger & RaiseLogger;
}

/** Why a connection is refused, with its fields as data. */
export type SessionRefusal =
  /** The settings are malformed (FP400); `message` says which and how. */
  | { reason: 'invalid_setting'; message: string; hint?: string }
  /** The key may not write this fence key (its prefixes). */
  | { reason: 'outside_prefixes'; fenceKey: string }
  /** Writes are refused while a failover could lose a raise. */
  | { reason: 'durability' }
  /** A newer leader holds the fence. */
  | { reason: 'stale'; fenceKey: string; token: bigint; highestToken: bigint }
  /** The forgery guard did not verify the token as the current leader's. */
  | { reason: 'unverified'; fenceKey: string; token: bigint; highestToken: bigint | null }
  /** The forgery guard could not ask ZooKeeper. */
  | { reason: 'guard_unavailable'; fenceKey: string; token: bigint; highestToken: bigint | null }
  /** The fence could not be raised to the token (`raiseFailed`: the raise failed, else another token raised it meanwhile). */
  | { reason: 'not_raised'; fenceKey: string; token: bigint; raiseFailed: boolean }
  /** The setup or fence_session failed on the backend: Postgres's SQLSTATE and words. */
  | { reason: 'could_not_fence'; fenceKey: string; token: bigint; sqlState: string | null; message: string | null };

/** What the connection is, once decided. */
export type SessionFence = { kind: 'unfenced' } | { kind: 'fenced'; pair: FencePair } | { kind: 'refused'; refusal: SessionRefusal };

/** What a session fence needs of the Fence (fence.ts). */
export interface SessionFenceHost {
  /** Fence.raiseFor: the doors' one wait policy, counted from `since`. */
  raiseFor(fences: readonly FencePair[], writerId: string | null, opts: { since: number; logger?: RaiseLogger }): Promise<unknown>;
}

/** A fencepost.token is at most 19 digits (MAX_TOKEN) after leading zeros (a ZooKeeper sequence suffix keeps them). */
const MAX_TOKEN_CHARS = 64;
/** Client text quoted into a refusal or a log line: at most this many characters of it. */
const QUOTED_CHARS = 64;

/** `value` as JSON, cut to QUOTED_CHARS characters with a note of its whole length. */
export function quoteBounded(value: string, bytes = Buffer.byteLength(value, 'utf8')): string {
  if (value.length <= QUOTED_CHARS && bytes === Buffer.byteLength(value, 'utf8')) return JSON.stringify(value);
  return `${JSON.stringify(value.slice(0, QUOTED_CHARS))}… (${bytes} bytes)`;
}

const invalid = (message: string, hint?: string): SessionRefusal => ({ reason: 'invalid_setting', message, ...(hint ? { hint } : {}) });

/** The settings' pair, or why they are refused (null: no token, an unfenced connection). */
function settingsPair(s: FenceSettings, mayWrite: (fenceKey: string) => boolean): FencePair | null | SessionRefusal {
  if (s.token === null || s.token === '') return null;
  // Sizes first: nothing of an oversized value is parsed or quoted.
  const tokenBytes = Buffer.byteLength(s.token, 'utf8');
  if (tokenBytes > MAX_TOKEN_CHARS) {
    return invalid(
      `fencepost.token is too long: ${tokenBytes} bytes, a token is at most 19 digits (0 to ${MAX_TOKEN}, at most ${MAX_TOKEN_CHARS} characters with leading zeros)`,
    );
  }
  const fenceKeyBytes = s.fenceKey === null ? 0 : Buffer.byteLength(s.fenceKey, 'utf8');
  if (fenceKeyBytes > MAX_KEY_BYTES)
    return invalid(`fencepost.fence_key is too long: ${fenceKeyBytes} bytes, a fence key is at most ${MAX_KEY_BYTES} bytes`);
  const parsed = parseToken(s.token);
  if (!parsed.ok) return invalid(`fencepost.token must be decimal digits, 0 to ${MAX_TOKEN}, got ${quoteBounded(s.token)}`);
  if (s.fenceKey === null || s.fenceKey === '') {
    return invalid(
      'fencepost.token is set but fencepost.fence_key is not',
      'connect with -c fencepost.fence_key=… next to -c fencepost.token=… in the startup options',
    );
  }
  const problem = keyProblem(s.fenceKey);
  if (problem !== null) return invalid(`fencepost.fence_key ${problem}`);
  if (!mayWrite(s.fenceKey)) return { reason: 'outside_prefixes', fenceKey: s.fenceKey };
  return { fenceKey: s.fenceKey, token: parsed.token };
}

const refused = (refusal: SessionRefusal): SessionFence => ({ kind: 'refused', refusal });

/**
 * Readies a backend no writer has yet (the SQL endpoint's spare, listener.ts) for its fence: the
 * setup's read and fence_session with no fence key, which registers nothing. What a backend that has
 * just started does for the first time (plpgsql's load, the function's compile, the capability's
 * reads) is then done before a writer waits for it. True when both answered without an error.
 */
export async function warmSession(capability: string, backend: SessionBackend): Promise<boolean> {
  const setup = await backend.query(connectionSetup());
  const start = setup.rows[0] ?? '';
  if (setup.error !== null || start === '') return false;
  const r = await backend.query(fenceConnection(capability, { pid: backend.pid, start }, null, null));
  return r.error === null;
}

/** Decides the connection's fence from its startup settings, on its backend (see the top of this file). */
export async function enterSession(host: SessionFenceHost, req: SessionRequest, backend: SessionBackend): Promise<SessionFence> {
  const since = Date.now();
  const pair = settingsPair(req.settings, req.mayWrite);
  if (pair === null) return { kind: 'unfenced' };
  if (!('token' in pair)) return refused(pair);
  if (req.refusing) return refused({ reason: 'durability' });
  const { fenceKey, token } = pair;
  const couldNotFence = (error: { code: string | null; message: string | null } | null): SessionFence =>
    refused({ reason: 'could_not_fence', fenceKey, token, sqlState: error?.code ?? null, message: error?.message ?? null });
  const setup = await backend.query(connectionSetup());
  const start = setup.rows[0] ?? '';
  if (setup.error !== null || start === '') {
    req.logger.warn({ failure: setup.error?.message }, 'could not set the SQL connection up; it is refused');
    return couldNotFence(setup.error);
  }
  const fence = async (): Promise<{ highest: bigint | null } | SessionFence> => {
    const r = await backend.query(fenceConnection(req.capability, { pid: backend.pid, start }, fenceKey, token));
    if (r.error !== null) {
      req.logger.warn({ fenceKey, token: token.toString(), failure: r.error.message }, 'could not fence the SQL connection');
      return couldNotFence(r.error);
    }
    const h = r.rows[0] ?? '';
    return { highest: h === '' ? null : BigInt(h) };
  };
  const decided = (highest: bigint): SessionFence =>
    highest === token ? { kind: 'fenced', pair } : refused({ reason: 'stale', fenceKey, token, highestToken: highest });
  let r = await fence();
  if (!('highest' in r)) return r;
  if (r.highest !== null && r.highest >= token) return decided(r.highest);
  // A new leader's first connection: the fence is absent or below its token.
  const guard = req.guard;
  if (guard !== null && guard.guards(fenceKey)) {
    const verdict = await guard.admit(fenceKey, token).then(
      () => 'verified' as const,
      (err: unknown) => ((err as { code?: string }).code === 'unavailable' ? ('unavailable' as const) : ('refused' as const)),
    );
    if (verdict !== 'verified') {
      req.logger.info(
        { fenceKey, token: token.toString(), unavailable: verdict === 'unavailable' },
        "forgery guard did not admit the connection's token",
      );
      return refused({ reason: verdict === 'unavailable' ? 'guard_unavailable' : 'unverified', fenceKey, token, highestToken: r.highest });
    }
  }
  let raiseFailed = false;
  try {
    await host.raiseFor([pair], req.writerId, { since, logger: req.logger });
  } catch (err) {
    raiseFailed = true;
    // A prepared transaction holding the fence row is named (raise.ts): only an operator ends it.
    const preparedTransaction = err instanceof FenceHeldByPreparedError ? err.preparedTransaction : undefined;
    req.logger.warn(
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
  if (r.highest !== null && r.highest >= token) return decided(r.highest);
  return refused({ reason: 'not_raised', fenceKey, token, raiseFailed });
}
