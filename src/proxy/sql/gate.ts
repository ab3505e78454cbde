// What a session does before a transaction starts at idle: know its token and fence key (startup
// options; read back with a SELECT after text that mentions `fencepost`), put them to the forgery
// guard when it guards that fence key, and raise the fence to the token when it is absent or below
// (src/fence/raise.ts: a statement on the proxy's pool, synchronous_commit on, holding the fence row
// only for that statement). The transaction then takes the fence at its token inside itself; the
// fence function never raises (definitions.ts fence_transaction: RAISE_FIRST).
//
// This only prepares the transaction: whatever happened here, it goes ahead and the fence in it
// decides (stale: FP409; a raise that failed here: FP428; a guarded raise the guard did not admit:
// FP409 "unverified", session_guard_check). A pair is raised once; the settings are read again
// after text that may change them.
import type { Logger } from 'pino';
import { keyProblem } from '../../fence/key.ts';
import { FenceHeldByPreparedError } from '../../fence/prepared-holders.ts';
import { guardState } from './fence.ts';

/** The forgery guard, as the session uses it (src/proxy/forgery-guard.ts). */
export interface SessionGuard {
  /** Every guarded fence-key prefix. */
  prefixes: readonly string[];
  /** Is this fence key guarded? */
  guards(fenceKey: string): boolean;
  /** Resolves when (fenceKey, token) may raise the fence; throws an ApiError (`unverified_token`, `unavailable`) when not. */
  admit(fenceKey: string, token: bigint): Promise<void>;
}

/** fencepost.token and fencepost.fence_key, as the session last knew them. */
export interface FenceSettings {
  token: string | null;
  fenceKey: string | null;
}

/** What the gate needs of the session. */
export interface GateHost {
  /** Sends a Query of the proxy's ahead of the writer's messages: `onRow` sees each row's texts, `then` runs at its ReadyForQuery. */
  query(sql: string, onRow: (values: string[]) => void, then: () => void): void;
  /** The gate is done (the guard's state() may have changed): rebuild the fence, go on with the writer's messages. */
  done(): void;
}

export interface GateOptions {
  /** The forgery guard; null: none. */
  guard: SessionGuard | null;
  /** The key's fence-key prefixes; null in open mode (any fence key). */
  prefixes: readonly string[] | null;
  /** Raises the fence to the token where it is absent or below (raise.ts); throws when it could not. */
  raise: (fenceKey: string, token: bigint) => Promise<void>;
  startupSettings: FenceSettings;
  /** Writes are refused now (FENCEPOST_REQUIRE_SYNC_STANDBY): no raise, the refusal in the fence's place fails the transaction. */
  refusing?: () => boolean;
  host: GateHost;
  logger: Logger;
}

const READ_SETTINGS_SQL = "SELECT pg_catalog.current_setting('fencepost.token', true), pg_catalog.current_setting('fencepost.fence_key', true)";
const MAX_TOKEN = (1n << 63n) - 1n;

type Pair = { fenceKey: string; token: bigint };
const samePair = (a: Pair | null, b: Pair | null) => a !== null && b !== null && a.fenceKey === b.fenceKey && a.token === b.token;

export class FenceGate {
  /** The session's settings as last known (null: read them back before the next transaction). */
  private settings: FenceSettings | null;
  /** What the guard said about a (fence key, token) of this session. */
  private checked: (Pair & { verdict: 'verified' | 'unavailable' | 'refused' }) | null = null;
  /** The pair whose fence was raised (or found at or above its token). */
  private raised: Pair | null = null;
  /** The pair of the settings as last known when a transaction was let through. */
  private lastPair: Pair | null = null;
  private busy = false;
  /** The gate could not prepare this pair: let the next transaction through (its fence decides), try again after. */
  private pass = false;

  constructor(private readonly opts: GateOptions) {
    this.settings = opts.startupSettings;
  }

  /** The guard state handed to the fence (null without a guard). */
  state(): string | null {
    const guard = this.opts.guard;
    if (guard === null) return null;
    const c = this.checked;
    return guardState(guard.prefixes, c === null || c.verdict === 'refused' ? null : { fenceKey: c.fenceKey, token: c.token, verdict: c.verdict });
  }

  /**
   * The (fence key, token) the session's transaction in progress started with (the settings may
   * have been marked unknown since: text that mentions `fencepost`), if the proxy could raise its fence.
   */
  pair(): { fenceKey: string; token: bigint } | null {
    return this.lastPair;
  }

  /** The writer's text may change its fencepost settings: read them back before the next transaction. */
  noteText(text: string): void {
    if (/fencepost/i.test(text)) this.settings = null;
  }

  /** May the transaction about to start go ahead now? It waits while the gate reads, asks or raises. */
  ready(): boolean {
    if (this.busy) return false;
    if (this.pass) {
      this.pass = false;
      if (this.settings !== null) this.lastPair = this.pairOf(this.settings);
      return true;
    }
    if (this.settings === null) return false;
    const pair = this.pairOf(this.settings);
    const go = pair === null || samePair(pair, this.raised);
    if (go) this.lastPair = pair;
    return go;
  }

  /** Reads the settings back if needed, asks the guard, raises; host.done() after. */
  start(): void {
    if (this.busy) return;
    this.busy = true;
    if (this.settings === null) {
      const read: FenceSettings = { token: null, fenceKey: null };
      this.opts.host.query(
        READ_SETTINGS_SQL,
        (values) => {
          read.token = values[0] || null;
          read.fenceKey = values[1] || null;
        },
        () => {
          this.settings = read;
          void this.prepare();
        },
      );
      return;
    }
    void this.prepare();
  }

  /** The settings' (fence key, token) when the proxy may raise its fence for this session, else null. */
  private pairOf(s: FenceSettings): Pair | null {
    if (s.token === null || s.fenceKey === null || !/^[0-9]{1,19}$/.test(s.token) || keyProblem(s.fenceKey) !== null) return null;
    const token = BigInt(s.token);
    if (token > MAX_TOKEN) return null;
    const prefixes = this.opts.prefixes;
    if (prefixes !== null && !prefixes.some((p) => s.fenceKey!.startsWith(p))) return null;
    return { fenceKey: s.fenceKey, token };
  }

  private async prepare(): Promise<void> {
    await Promise.resolve(); // never done() from inside start(): the relay is in the middle of its loop
    const pair = this.settings === null ? null : this.pairOf(this.settings);
    try {
      if (pair === null || samePair(pair, this.raised) || this.opts.refusing?.()) return;
      const { fenceKey, token } = pair;
      const guard = this.opts.guard;
      if (guard !== null && guard.guards(fenceKey)) {
        const verdict = await guard.admit(fenceKey, token).then(
          () => 'verified' as const,
          (err: unknown) => ((err as { code?: string }).code === 'unavailable' ? ('unavailable' as const) : ('refused' as const)),
        );
        this.checked = { fenceKey, token, verdict };
        if (verdict !== 'verified') {
          this.opts.logger.info({ fenceKey, token: token.toString(), unavailable: verdict === 'unavailable' }, 'forgery guard did not admit the session\'s token');
          return;
        }
      }
      try {
        await this.opts.raise(fenceKey, token);
        this.raised = pair;
      } catch (err) {
        // A prepared transaction holding the fence row is named (raise.ts): only an operator ends it.
        const preparedTransaction = err instanceof FenceHeldByPreparedError ? err.preparedTransaction : undefined;
        this.opts.logger.warn({ fenceKey, token: token.toString(), err: (err as Error).message, ...(preparedTransaction !== undefined ? { preparedTransaction } : {}) }, 'could not raise the session\'s fence; its transaction is refused (FP428)');
      }
    } finally {
      this.busy = false;
      this.pass = true; // whatever happened: the fence decides this transaction
      this.opts.host.done();
    }
  }
}
