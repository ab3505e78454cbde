// One writer's session after authentication: its connection is fenced once, on its own backend,
// before the writer hears that the session is ready (fencer.ts); then the relay carries the
// writer's messages and the database's answers as they are (relay.ts). A newer leader's raise ends
// the backend (the database does: definitions.ts revoke_older_sessions); the writer then hears
// FP409 and the connection closes. While writes are refused for durability
// (FENCEPOST_REQUIRE_SYNC_STANDBY), fenced sessions are ended and new ones refused (FP533).
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import type { MessageReader } from './wire/framing.ts';
import { errorResponse, type ErrorFields } from './wire/backend.ts';
import { Relay, type TransactionEnd } from './relay.ts';
import {
  durabilityRefusal,
  fenceConnection,
  type ConnectionFence,
  type FencePair,
  type FenceSettings,
  type SessionGuard,
  type StaleRefusal,
} from './fencer.ts';
import { queryBackend, type Backend } from './backend.ts';
import { STALE_TOKEN, staleDetailText, connectionSetup, fenceConnection as fenceConnectionSql } from '../../fence/index.ts';

export type { SessionGuard, StaleRefusal } from './fencer.ts';
export type { TransactionEnd } from './relay.ts';

export interface SessionOptions {
  logger: Logger;
  capability: string;
  /** The key's fence-key prefixes; null in open mode. */
  prefixes: readonly string[] | null;
  /** The forgery guard; null or absent: none. */
  guard?: SessionGuard | null;
  /** fencepost.token and fencepost.fence_key from the startup settings. */
  startupSettings: FenceSettings;
  /** Raises a fence to a token where it is absent or below (src/fence/raise.ts on the proxy's pool). */
  raise: (fenceKey: string, token: bigint) => Promise<void>;
  /** The fence's highest token once a raise above `token` commits (waiting a little), else null. */
  raisedAbove: (fenceKey: string, token: bigint, waitMs: number) => Promise<bigint | null>;
  /**
   * How long a backend ended by an administrator (57P01) waits for a raise to show as its reason:
   * a raise commits right after the backends it ended are gone. Past it, the writer hears
   * Postgres's own words (an operator's pg_terminate_backend is not kept waiting).
   */
  raiseCommitMs: number;
  /** The startup fence's statements must be answered within this. */
  fenceTimeoutMs: number;
  onStale: (refusal: StaleRefusal) => void;
  /** Writes refused while a failover could lose a fence raise (src/fence/durability-monitor.ts); null or absent: never. */
  durability?: { refusal(): unknown; onChange(listener: () => void): () => void } | null;
  /** Each transaction's end of a fenced session, with its fence key (relay.ts TransactionEnd); absent: not counted. */
  onTransactionEnd?: (end: TransactionEnd, fenceKey: string) => void;
  /** A connection refused for another reason than a stale token (fencer.ts ConnectionFence outcome). */
  onFenceError?: (outcome: 'error' | 'invalid') => void;
  /** The connection is fenced (or needs no fence): tell the writer its session is ready. */
  ready: () => void;
  onClose: () => void;
}

export class SqlSession {
  private relay: Relay | null = null;
  private unwatch: () => void = () => {};

  constructor(
    private readonly client: Socket,
    private readonly clientReader: MessageReader,
    private readonly backend: Backend,
    private readonly opts: SessionOptions,
  ) {}

  /** Fences the connection, then tells the writer it is ready and relays; or refuses it. */
  async start(): Promise<void> {
    const opts = this.opts;
    const refusing = () => opts.durability !== null && opts.durability !== undefined && opts.durability.refusal() !== null;
    let fence: ConnectionFence;
    try {
      fence = await fenceConnection(opts.startupSettings, {
        guard: opts.guard ?? null,
        prefixes: opts.prefixes,
        raise: opts.raise,
        refusing,
        query: (sql) => queryBackend(this.backend, sql, opts.fenceTimeoutMs),
        setupSql: connectionSetup(),
        fenceSql: (pair, start) => fenceConnectionSql(opts.capability, { pid: this.backend.pid, start }, pair.fenceKey, pair.token),
        logger: opts.logger,
      });
    } catch (err) {
      opts.logger.warn({ err }, 'SQL connection: the fence could not be decided; it is refused');
      fence = {
        kind: 'refused',
        outcome: 'error',
        error: {
          severity: 'FATAL',
          code: '08006',
          message: "the connection's fence could not be decided",
          hint: 'nothing was applied; connect again',
        },
      };
    }
    if (fence.kind === 'refused') {
      if (fence.stale) opts.onStale(fence.stale);
      if (fence.outcome) opts.onFenceError?.(fence.outcome);
      this.refuse(fence.error);
      return;
    }
    const pair = fence.kind === 'fenced' ? fence.pair : null;
    this.relay = new Relay(this.client, this.clientReader, this.backend, {
      logger: opts.logger,
      ...(pair !== null && opts.onTransactionEnd
        ? { onTransactionEnd: (end: TransactionEnd) => opts.onTransactionEnd!(end, pair.fenceKey) }
        : {}),
      lostReason: (terminated) => this.lostReason(pair, terminated),
      onClose: () => {
        this.unwatch();
        opts.onClose();
      },
    });
    if (pair !== null && opts.durability) {
      this.unwatch = opts.durability.onChange(() => {
        if (refusing()) this.relay?.revoke(durabilityRefusal());
      });
    }
    opts.ready();
    this.relay.start();
  }

  /** The writer's answer to its startup is this refusal; the backend goes. */
  private refuse(fields: ErrorFields): void {
    this.backend.socket.destroy();
    if (!this.client.destroyed) this.client.end(errorResponse(fields), () => this.client.destroy());
    this.opts.onClose();
  }

  /** A backend lost because a newer leader's raise ended it: the writer hears FP409, as if its next statement had come after the raise. */
  private async lostReason(pair: FencePair | null, terminated: boolean): Promise<ErrorFields | null> {
    if (pair === null) return null;
    const highest = await this.opts.raisedAbove(pair.fenceKey, pair.token, terminated ? this.opts.raiseCommitMs : 0);
    if (highest === null) return null;
    this.opts.onStale({ fenceKey: pair.fenceKey, token: pair.token, highestToken: highest });
    return {
      severity: 'FATAL',
      code: STALE_TOKEN,
      message: `stale fencing token: a newer leader raised fence key ${JSON.stringify(pair.fenceKey)} to token ${highest}, above this connection's token ${pair.token}`,
      detail: staleDetailText(pair.fenceKey, pair.token, highest),
      hint: "the raise ended this connection: what its open transaction did was not applied; reconnect with the new leader's token",
    };
  }
}
