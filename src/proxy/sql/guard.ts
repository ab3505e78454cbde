// The forgery guard in a session (when configured): before a transaction starts at idle, the
// session's token and fence key (startup options; read back with a SELECT after text that mentions
// `fencepost`) are put to the guard; its verdict goes to the fence as a parameter, and the fence
// refuses a raise of a guarded fence by any pair the guard did not admit (session_guard_check in
// src/fence/definitions.ts).
//
// This only spares an admitted leader's transaction that refusal: whatever the verdict, the next
// transaction goes ahead and the fence decides it.
import type { Logger } from 'pino';
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

/** What the check needs of the session. */
export interface GuardHost {
  /** Sends a Query of the proxy's ahead of the writer's messages: `onRow` sees each row's texts, `then` runs at its ReadyForQuery. */
  query(sql: string, onRow: (values: string[]) => void, then: () => void): void;
  /** The verdict is in (state() has changed): rebuild the fence, go on with the writer's messages. */
  done(): void;
}

const READ_SETTINGS_SQL = "SELECT pg_catalog.current_setting('fencepost.token', true), pg_catalog.current_setting('fencepost.fence_key', true)";

export class GuardCheck {
  /** The session's settings as last known (null: read them back before the next transaction). */
  private settings: FenceSettings | null;
  /** What the guard said about a (fence key, token) of this session. */
  private checked: { fenceKey: string; token: bigint; verdict: 'verified' | 'unavailable' | 'refused' } | null = null;
  private busy = false;
  /** The guard did not admit the session's token: let the next transaction through (the fence refuses it), ask again after. */
  private pass = false;

  constructor(
    private readonly guard: SessionGuard,
    startupSettings: FenceSettings,
    private readonly host: GuardHost,
    private readonly logger: Logger,
  ) {
    this.settings = startupSettings;
  }

  /** The guard state handed to the fence. */
  state(): string {
    const c = this.checked;
    return guardState(this.guard.prefixes, c === null || c.verdict === 'refused' ? null : { fenceKey: c.fenceKey, token: c.token, verdict: c.verdict });
  }

  /** The writer's text may change its fencepost settings: read them back before the next transaction. */
  noteText(text: string): void {
    if (/fencepost/i.test(text)) this.settings = null;
  }

  /**
   * May the transaction about to start go ahead now? It must wait while the session's settings are
   * read back or the guard asked about a token that could raise a guarded fence.
   */
  ready(): boolean {
    if (this.busy) return false;
    if (this.pass) {
      this.pass = false;
      return true;
    }
    const s = this.settings;
    if (s === null) return false;
    const pair = this.guardedPair(s);
    if (pair === null) return true;
    const c = this.checked;
    return c !== null && c.fenceKey === pair.fenceKey && c.token === pair.token && c.verdict === 'verified';
  }

  /** Reads the settings back if needed, then asks the guard; host.done() after. */
  start(): void {
    if (this.busy) return;
    this.busy = true;
    if (this.settings === null) {
      const read: FenceSettings = { token: null, fenceKey: null };
      this.host.query(
        READ_SETTINGS_SQL,
        (values) => {
          read.token = values[0] || null;
          read.fenceKey = values[1] || null;
        },
        () => {
          this.settings = read;
          this.ask();
        },
      );
      return;
    }
    this.ask();
  }

  /** The settings' (fence key, token) when they could raise a guarded fence, else null. */
  private guardedPair(s: FenceSettings): { fenceKey: string; token: bigint } | null {
    if (s.token === null || s.fenceKey === null || !/^[0-9]{1,19}$/.test(s.token) || !this.guard.guards(s.fenceKey)) return null;
    return { fenceKey: s.fenceKey, token: BigInt(s.token) };
  }

  private ask(): void {
    const pair = this.settings === null ? null : this.guardedPair(this.settings);
    if (pair === null) {
      queueMicrotask(() => this.finish());
      return;
    }
    const { fenceKey, token } = pair;
    this.guard.admit(fenceKey, token).then(
      () => {
        this.checked = { fenceKey, token, verdict: 'verified' };
      },
      (err: unknown) => {
        const unavailable = (err as { code?: string }).code === 'unavailable';
        this.logger.info({ fenceKey, token: token.toString(), unavailable }, 'forgery guard did not admit the session\'s token');
        this.checked = { fenceKey, token, verdict: unavailable ? 'unavailable' : 'refused' };
      },
    ).finally(() => this.finish());
  }

  private finish(): void {
    this.busy = false;
    this.pass = true; // whatever the verdict: the fence decides this transaction
    this.host.done();
  }
}
