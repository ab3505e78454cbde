// The session fence of the SQL endpoint (rule.ts): before a transaction starts at idle, the fencer
// knows the session's token and fence key (startup options; read back with a SELECT after text
// that mentions `fencepost`) and, once per (fence key, token), decides what the session's
// transactions carry (planner.ts SessionFence):
// - no token: read-only;
// - malformed settings, or a fence key outside the key's prefixes: refused (FP400, 42501);
// - a guarded fence key whose token the forgery guard does not admit: refused (FP409 unverified,
//   FP503 when ZooKeeper could not be asked);
// - otherwise the fence is raised to the token where it is absent or below (src/fence/raise.ts, a
//   transaction of the proxy's own), and the session fences itself on its own backend
//   (fence_session): at the fence's highest token it passed, and each transaction carries only the
//   epoch proof; stale: refused (FP409); still below: refused (FP428).
// A verdict stands until the settings change, or the relay reports that the session lost its fence
// (DISCARD, or a proof that failed: a raise above it). The database decides whether a write lands
// (the proof, and the protected tables' triggers); the fencer decides only what the session asks.
import type { Logger } from 'pino';
import {
  keyProblem,
  MAX_KEY_BYTES,
  FenceHeldByPreparedError,
  GUARD_UNAVAILABLE,
  INVALID_FENCE_SETTING,
  RAISE_FIRST,
  STALE_TOKEN,
  staleDetailText,
  INSUFFICIENT_PRIVILEGE,
  MAX_TOKEN,
  parseToken,
} from '../../fence/index.ts';
import type { ErrorFields } from './wire/backend.ts';
import { provenSessionFence, readOnlySessionFence, refusedSessionFence, type SessionFence } from './planner.ts';
import { withinPrefixes } from '../access/keys.ts';

/** The forgery guard, as the session uses it (src/proxy/forgery-guard.ts). */
export interface SessionGuard {
  /** Is this fence key guarded? */
  guards(fenceKey: string): boolean;
  /** Resolves when (fenceKey, token) may raise the fence; throws an ApiError (`unverified_token`, `unavailable`) when not. */
  admit(fenceKey: string, token: bigint): Promise<void>;
}

/**
 * fencepost.token and fencepost.fence_key, as the session last knew them. Read back from the
 * backend, each is cut to its first characters (READ_SETTINGS_SQL) and comes with its whole length
 * in bytes: a longer one is refused by its length, so a megabyte a writer SET never crosses to the
 * proxy, into a refusal or a log line.
 */
export interface FenceSettings {
  token: string | null;
  fenceKey: string | null;
  /** UTF-8 bytes of the whole setting, where it was cut (else the string is whole). */
  tokenBytes?: number;
  fenceKeyBytes?: number;
}

/** What the fencer needs of the session. */
export interface GateHost {
  /**
   * Sends a Query of the proxy's ahead of the writer's messages: `onRow` sees each row's texts,
   * `onError` its error, if any; `then` runs at its ReadyForQuery.
   */
  query(sql: string, onRow: (values: string[]) => void, then: () => void, onError?: (fields: Map<string, string>) => void): void;
  /** The gate is done: the session's fence may have changed; go on with the writer's messages. */
  done(): void;
}

export interface GateOptions {
  /** The forgery guard; null: none. */
  guard: SessionGuard | null;
  /** The key's fence-key prefixes; null in open mode (any fence key). */
  prefixes: readonly string[] | null;
  /** Raises the fence to the token where it is absent or below (raise.ts); throws when it could not. */
  raise: (fenceKey: string, token: bigint) => Promise<void>;
  /** The SQL that sets the session's backend up (fencepost_api.session_start): one value, the backend's start. */
  setupSql: string;
  /** The SQL that fences this session's backend for `pair` (fence_session with a capability bound to the backend, its pid and `start`). */
  fenceSql: (pair: Pair, start: string) => string;
  startupSettings: FenceSettings;
  /** Writes are refused now (FENCEPOST_REQUIRE_SYNC_STANDBY): no raise (the session's fence is the refusal, session.ts). */
  refusing?: () => boolean;
  host: GateHost;
  logger: Logger;
}

/**
 * A fencepost.token is at most 19 digits (MAX_TOKEN) after leading zeros (a ZooKeeper sequence
 * suffix keeps them); a longer text than this is refused by its length, unread.
 */
export const MAX_TOKEN_CHARS = 64;
/** The settings, each cut to one character past its limit, and its whole length in bytes. */
const READ_SETTINGS_SQL = `SELECT pg_catalog.left(t, ${MAX_TOKEN_CHARS + 1}), pg_catalog.octet_length(t), pg_catalog.left(k, ${MAX_KEY_BYTES + 1}), pg_catalog.octet_length(k) FROM (SELECT pg_catalog.current_setting('fencepost.token', true) AS t, pg_catalog.current_setting('fencepost.fence_key', true) AS k) s`;
/** Client text quoted into a refusal or a log line: at most this many characters of it. */
const QUOTED_CHARS = 64;

/** `value` as JSON, cut to QUOTED_CHARS characters with a note of its whole length. */
export function quoteBounded(value: string, bytes = Buffer.byteLength(value, 'utf8')): string {
  if (value.length <= QUOTED_CHARS && bytes === Buffer.byteLength(value, 'utf8')) return JSON.stringify(value);
  return `${JSON.stringify(value.slice(0, QUOTED_CHARS))}… (${bytes} bytes)`;
}

type Pair = { fenceKey: string; token: bigint };

const refusal = (code: string, message: string, detail?: string, hint?: string): ErrorFields => ({
  severity: 'ERROR',
  code,
  message,
  ...(detail !== undefined ? { detail } : {}),
  ...(hint !== undefined ? { hint } : {}),
});

export class SessionFencer {
  /** The session's settings as last known (null: read them back before the next transaction). */
  private settings: FenceSettings | null;
  /** The session's backend has its setup (session_start's temporary sequence). */
  private setUp = false;
  /** The backend's start, as session_start gave it (the capabilities are bound to it); '' until then, or when it failed. */
  private backendStart = '';
  /** What the session's transactions carry, and the settings it was decided for. */
  /** The session's fence as decided for the settings `for` (their signature; `settings`: the very object, checked first). */
  private verdict: { for: string; settings: FenceSettings | null; fence: SessionFence; once: boolean } | null = null;
  private busy = false;
  /** The decision under way was asked for ahead of any transaction (startAhead). */
  private ahead = false;

  constructor(private readonly opts: GateOptions) {
    this.settings = opts.startupSettings;
  }

  /** The fence the session's transactions carry now. */
  fence(): SessionFence {
    return this.verdict?.fence ?? readOnlySessionFence();
  }

  /** The (fence key, token) the session passed the fence at, if it did. */
  pair(): Pair | null {
    return this.verdict?.fence.pair ?? null;
  }

  /** The writer's text may change its fencepost settings: read them back before the next transaction. */
  noteText(text: string): void {
    if (/fencepost/i.test(text)) this.settings = null;
  }

  /**
   * A RESET (RESET ALL, or of one setting) may have set the fencepost settings and the session's
   * read-write default back to their startup values: read them back and fence the session again.
   */
  noteReset(): void {
    this.settings = null;
    this.verdict = null;
  }

  /**
   * The session may have lost its fence or setup (DISCARD, a proof that failed): decide again
   * before the next transaction. `setUp`: the temporary sequence may be gone too.
   */
  invalidate(setUp: boolean): void {
    this.verdict = null;
    if (setUp) this.setUp = false;
  }

  /** May the transaction about to start go ahead now? It waits while the fencer reads, asks, raises or fences. */
  ready(): boolean {
    if (this.busy || this.settings === null || !this.setUp || this.verdict === null) return false;
    const v = this.verdict;
    if (v.settings !== this.settings && v.for !== signature(this.settings)) return false;
    // A verdict of a failure that may pass: this transaction carries it, the next one asks again.
    if (v.once) this.verdict = { ...v, for: '', settings: null };
    return true;
  }

  /**
   * Decides ahead of any transaction (at startup); host.done() after. A verdict that holds for one
   * transaction only (a failure that may pass) is not kept: the first transaction asks again.
   */
  startAhead(): void {
    if (this.busy) return;
    this.ahead = true;
    this.start();
  }

  /** Reads the settings back if needed, then decides; host.done() after. */
  start(): void {
    if (this.busy) return;
    this.busy = true;
    if (this.settings === null) {
      const read: FenceSettings = { token: null, fenceKey: null };
      this.opts.host.query(
        READ_SETTINGS_SQL,
        (values) => {
          read.token = values[0] || null;
          read.fenceKey = values[2] || null;
          // The lengths only where a value was cut (else the same settings keep their verdict).
          if (read.token !== null && Number(values[1]) !== Buffer.byteLength(read.token, 'utf8')) read.tokenBytes = Number(values[1]);
          if (read.fenceKey !== null && Number(values[3]) !== Buffer.byteLength(read.fenceKey, 'utf8'))
            read.fenceKeyBytes = Number(values[3]);
        },
        () => {
          this.settings = read;
          void this.decide();
        },
      );
      return;
    }
    void this.decide();
  }

  /**
   * Runs fence_session on the session's backend: the fence's highest token, and the oid of the epoch
   * it fenced the session in ('' when it did not); or how the call failed.
   */
  private fenceSession(pair: Pair): Promise<{ highest: bigint | null; epoch: string } | { failure: string; code: string }> {
    return new Promise((resolve) => {
      let highest: bigint | null = null;
      let epoch = '';
      let failure: { failure: string; code: string } | null = null;
      this.opts.host.query(
        this.opts.fenceSql(pair, this.backendStart),
        (values) => {
          highest = values[0] ? BigInt(values[0]) : null;
          epoch = values[1] ?? '';
        },
        () => resolve(failure ?? { highest, epoch }),
        (fields) => (failure = { failure: fields.get('M') ?? '', code: fields.get('C') ?? RAISE_FIRST }),
      );
    });
  }

  /** Runs session_start on the session's backend; null when it did, else the failure's message. */
  private setUpSession(): Promise<string | null> {
    return new Promise((resolve) => {
      let failure: string | null = null;
      this.opts.host.query(
        this.opts.setupSql,
        (values) => (this.backendStart = values[0] ?? ''),
        () => resolve(failure),
        (fields) => (failure = fields.get('M') ?? 'failed'),
      );
    });
  }

  private async decide(): Promise<void> {
    await Promise.resolve(); // never done() from inside start(): the relay is in the middle of its loop
    const settings = this.settings!;
    try {
      if (!this.setUp) {
        const r = await this.setUpSession();
        if (r !== null) this.opts.logger.warn({ failure: r }, 'could not set the SQL session up; its transactions fail until it is');
        this.setUp = true; // a failure shows in every transaction (the no-PREPARE read fails): fail closed
      }
      const { fence, once } = await this.verdictFor(settings);
      this.verdict = { for: signature(settings), settings, fence, once };
    } catch (err) {
      this.opts.logger.warn({ err }, 'SQL session: the fence could not be decided; this transaction is refused');
      this.verdict = {
        for: signature(settings),
        settings,
        fence: refusedSessionFence(
          refusal(
            RAISE_FIRST,
            "the session's fence could not be decided",
            undefined,
            'nothing of this transaction was applied; safe to retry',
          ),
        ),
        once: true,
      };
    } finally {
      if (this.ahead && this.verdict?.once) this.verdict = null;
      this.ahead = false;
      this.busy = false;
      this.opts.host.done();
    }
  }

  /** fence_session's answer for `pair` when the fence is at or above its token: fenced (in `epoch`), or stale. */
  private fenced(pair: Pair, highest: bigint, epoch: string): { fence: SessionFence; once: boolean } {
    const { fenceKey, token } = pair;
    if (highest === token) {
      if (/^[1-9][0-9]{0,9}$/.test(epoch)) return { fence: provenSessionFence(pair, epoch), once: false };
      // Not what fence_session leaves: fail closed, and fence the session again next time.
      const e = refusal(
        RAISE_FIRST,
        `the session passed fence ${JSON.stringify(fenceKey)} but its epoch is unknown`,
        undefined,
        'nothing of this transaction was applied; safe to retry',
      );
      return { fence: refusedSessionFence(e), once: true };
    }
    const e = refusal(
      STALE_TOKEN,
      `stale fencing token: token ${token} is below the highest token ${highest} of fence key ${JSON.stringify(fenceKey)}`,
      staleDetailText(fenceKey, token, highest),
      'a newer leader holds this fence: nothing of this transaction was applied',
    );
    return { fence: refusedSessionFence(e), once: false };
  }

  private async verdictFor(s: FenceSettings): Promise<{ fence: SessionFence; once: boolean }> {
    const refused = (e: ErrorFields, once = false) => ({ fence: refusedSessionFence(e), once });
    if (s.token === null || s.token === '') return { fence: readOnlySessionFence(), once: false };
    // Sizes first, by the lengths alone: nothing of an oversized value is parsed or quoted.
    const tokenBytes = s.tokenBytes ?? Buffer.byteLength(s.token, 'utf8');
    if (tokenBytes > MAX_TOKEN_CHARS) {
      return refused(
        refusal(
          INVALID_FENCE_SETTING,
          `fencepost.token is too long: ${tokenBytes} bytes, a token is at most 19 digits (0 to ${MAX_TOKEN}, at most ${MAX_TOKEN_CHARS} characters with leading zeros)`,
        ),
      );
    }
    const fenceKeyBytes = s.fenceKey === null ? 0 : (s.fenceKeyBytes ?? Buffer.byteLength(s.fenceKey, 'utf8'));
    if (fenceKeyBytes > MAX_KEY_BYTES) {
      return refused(
        refusal(
          INVALID_FENCE_SETTING,
          `fencepost.fence_key is too long: ${fenceKeyBytes} bytes, a fence key is at most ${MAX_KEY_BYTES} bytes`,
        ),
      );
    }
    const parsed = parseToken(s.token);
    if (!parsed.ok) {
      return refused(
        refusal(INVALID_FENCE_SETTING, `fencepost.token must be decimal digits, 0 to ${MAX_TOKEN}, got ${quoteBounded(s.token)}`),
      );
    }
    if (s.fenceKey === null || s.fenceKey === '') {
      return refused(
        refusal(
          INVALID_FENCE_SETTING,
          'fencepost.token is set but fencepost.fence_key is not',
          undefined,
          "SET fencepost.fence_key = '…' or -c fencepost.fence_key=… in the startup options",
        ),
      );
    }
    const problem = keyProblem(s.fenceKey);
    if (problem !== null) return refused(refusal(INVALID_FENCE_SETTING, `fencepost.fence_key ${problem}`));
    const prefixes = this.opts.prefixes;
    if (!withinPrefixes(prefixes, s.fenceKey)) {
      return refused(
        refusal(
          INSUFFICIENT_PRIVILEGE,
          `this key may not write fence key ${quoteBounded(s.fenceKey)}: it is outside its fence-key prefixes`,
        ),
      );
    }
    const pair: Pair = { fenceKey: s.fenceKey, token: parsed.token };
    const { fenceKey, token } = pair;
    if (this.opts.refusing?.()) return { fence: readOnlySessionFence(), once: true }; // session.ts sends the refusal meanwhile
    const guard = this.opts.guard;
    if (guard !== null && guard.guards(fenceKey)) {
      const verdict = await guard.admit(fenceKey, token).then(
        () => 'verified' as const,
        (err: unknown) => ((err as { code?: string }).code === 'unavailable' ? ('unavailable' as const) : ('refused' as const)),
      );
      if (verdict !== 'verified') {
        this.opts.logger.info(
          { fenceKey, token: token.toString(), unavailable: verdict === 'unavailable' },
          "forgery guard did not admit the session's token",
        );
        // A token that raises nothing needs no admission: the fence decides (at its token: fenced; above: stale).
        const r = await this.fenceSession(pair);
        const highest = 'failure' in r ? null : r.highest;
        if (highest !== null && highest >= token) return this.fenced(pair, highest, 'failure' in r ? '' : r.epoch);
        const detail = `unverified token: ${staleDetailText(fenceKey, token, highest)}`;
        if (verdict === 'unavailable') {
          return refused(
            refusal(
              GUARD_UNAVAILABLE,
              `cannot verify fencing token ${token} of fence key ${JSON.stringify(fenceKey)}: ZooKeeper unreachable`,
              detail,
              "the forgery guard could not ask ZooKeeper whether this token is the current leader's; nothing was applied, safe to retry",
            ),
            true,
          );
        }
        return refused(
          refusal(
            STALE_TOKEN,
            `unverified fencing token: token ${token} would raise fence key ${JSON.stringify(fenceKey)} but is not the current leader's`,
            detail,
            "the forgery guard did not verify this token as the sequence of the current leader's election node; nothing of this transaction was applied",
          ),
          true,
        );
      }
    }
    let raiseFailed = false;
    try {
      await this.opts.raise(fenceKey, token);
    } catch (err) {
      raiseFailed = true;
      // A prepared transaction holding the fence row is named (raise.ts): only an operator ends it.
      const preparedTransaction = err instanceof FenceHeldByPreparedError ? err.preparedTransaction : undefined;
      this.opts.logger.warn(
        {
          fenceKey,
          token: token.toString(),
          err: (err as Error).message,
          ...(preparedTransaction !== undefined ? { preparedTransaction } : {}),
        },
        "could not raise the session's fence; its transaction is refused (FP428)",
      );
    }
    const r = await this.fenceSession(pair);
    if ('failure' in r) {
      this.opts.logger.warn(
        { fenceKey, token: token.toString(), failure: r.failure },
        'could not fence the SQL session; its transaction is refused (FP428)',
      );
      // Its own SQLSTATE (55P03 lock timeout, 40001, 57014, …): the driver's retry logic knows them.
      return refused(
        refusal(
          r.code,
          `could not fence this session at token ${token} of fence key ${JSON.stringify(fenceKey)}: ${r.failure}`,
          undefined,
          'nothing of this transaction was applied; safe to retry',
        ),
        true,
      );
    }
    if (r.highest !== null && r.highest >= token) return this.fenced(pair, r.highest, r.epoch);
    return refused(
      refusal(
        RAISE_FIRST,
        `fence ${JSON.stringify(fenceKey)} could not be raised to token ${token}${raiseFailed ? '' : ' (raised meanwhile by another token?)'}`,
        undefined,
        'nothing of this transaction was applied; safe to retry',
      ),
      true,
    );
  }
}

function signature(s: FenceSettings): string {
  return JSON.stringify([s.token, s.fenceKey, s.tokenBytes, s.fenceKeyBytes]);
}
