// One writer's session after startup: relays messages between the writer and its backend
// connection, and fences the session. Three parts, by job:
// - planner.ts: what to send for each of the writer's messages (the transaction's proof, splits,
//   refusals); no sockets, so it is tested without a database.
// - relay.ts: the sockets, the responses owed for what was sent, forwarding and swallowing them.
// - fencer.ts: before a transaction, what the session's fence is (the forgery guard's check, the raise,
//   fence_session on the session's own backend).
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import pg from 'pg';
import type { MessageReader } from './wire/framing.ts';
import { Planner, refusalFence } from './planner.ts';
import { Relay, type StaleRefusal, type TransactionEnd } from './relay.ts';
import { SessionFencer, type FenceSettings, type SessionGuard } from './fencer.ts';
import type { Backend } from './backend.ts';
import type { ErrorFields } from './wire/backend.ts';
import { EPOCH_OID_SETTING, STALE_TOKEN, staleDetailText, sessionFenceCapability } from '../../fence/index.ts';

export type { SessionGuard } from './fencer.ts';
export type { StaleRefusal, TransactionEnd } from './relay.ts';

export interface SessionOptions {
  logger: Logger;
  capability: string;
  /** The key's fence-key prefixes; null in open mode. */
  prefixes: readonly string[] | null;
  writerId: string;
  /** The forgery guard; null or absent: none. */
  guard?: SessionGuard | null;
  /** fencepost.token and fencepost.fence_key from the startup options. */
  startupSettings?: FenceSettings;
  /** Raises a fence to a token where it is absent or below (src/fence/raise.ts on the proxy's pool). */
  raise: (fenceKey: string, token: bigint) => Promise<void>;
  /** The fence's highest token once a raise above `token` commits (waiting a little), else null. */
  raisedAbove: (fenceKey: string, token: bigint, waitMs: number) => Promise<bigint | null>;
  /** How long a raise may take to commit once it ended its holders (the lock timeout). */
  raiseCommitMs: number;
  /** A transaction left idle this long is ended (0: never). */
  idleInTransactionMs: number;
  onStale: (refusal: StaleRefusal) => void;
  /**
   * While this refuses (FENCEPOST_REQUIRE_SYNC_STANDBY and a failover could lose a fence raise,
   * src/fence/durability-monitor.ts), each transaction the session starts gets the refusal in the
   * fence's place (proof.ts REFUSE_UNSAFE_SQL) and no raise; absent: never refused.
   */
  durability?: { refusal(): unknown; onChange(listener: () => void): () => void } | null;
  /** Each fenced transaction's end, once, with its fence key (relay.ts TransactionEnd); absent: not counted. */
  onTransactionEnd?: (end: TransactionEnd, fenceKey: string) => void;
  /** A fence that failed for another reason than a stale token (relay.ts FENCE_ERROR_OUTCOMES). */
  onFenceError?: (outcome: 'error' | 'invalid') => void;
  /**
   * The session is fenced at startup: the fencer decides for the startup settings before the
   * writer's first message. Called once it has (the listener sends the writer's ReadyForQuery
   * then, so a pool's connection is fenced before it is handed out).
   */
  onStartupFenced?: () => void;
  onClose: () => void;
}

export class SqlSession {
  private readonly relay: Relay;
  private readonly gate: SessionFencer;
  private startupFenced: (() => void) | null;

  constructor(client: Socket, clientReader: MessageReader, backend: Backend, opts: SessionOptions) {
    const durability = opts.durability ?? null;
    const refusing = () => durability !== null && durability.refusal() !== null;
    const gate = new SessionFencer({
      guard: opts.guard ?? null,
      prefixes: opts.prefixes,
      raise: opts.raise,
      // Read-write for these calls only (sessions start read-only): they make the session's
      // temporary sequence, or the fence's epoch sequence. Committed locally: a catalog write of
      // the session's, not a fence raise (raise.ts), so it never waits for a synchronous standby
      // that may be the one not streaming.
      setupSql: 'SET transaction_read_only = off; SET LOCAL synchronous_commit = local; SELECT fencepost_api.session_start()',
      fenceSql: (pair, start) => {
        const cap = sessionFenceCapability(opts.capability, { pid: backend.pid, start }, pair.fenceKey, pair.token);
        // A session with a token is read-write by default from now on, as straight to Postgres: a
        // transaction that is not proven carries a read-only SET of its own (proof.ts).
        // The row: the highest token, and the oid of the epoch fence_session fenced the session in
        // (read in the same statement, after the call: nothing of the writer's runs between), which
        // each transaction's proof names (proof.ts proofSql).
        return `SET transaction_read_only = off; SET default_transaction_read_only = off; SET LOCAL synchronous_commit = local; SELECT h, pg_catalog.current_setting('${EPOCH_OID_SETTING}', true) FROM fencepost_api.fence_session(${pg.escapeLiteral(cap)}, ${pg.escapeLiteral(pair.fenceKey)}, ${pair.token.toString()}) AS h`;
      },
      startupSettings: opts.startupSettings ?? { token: null, fenceKey: null },
      refusing,
      host: {
        query: (sql, onRow, then, onError) => this.relay.query(sql, onRow, then, onError),
        done: () => {
          planner.fence = fence();
          // The startup reply goes out before anything the writer sent meanwhile is answered.
          const fenced = this.startupFenced;
          this.startupFenced = null;
          if (fenced !== null) {
            this.relay.releaseStartup();
            fenced();
          }
          this.relay.resume();
        },
      },
      logger: opts.logger,
    });
    this.gate = gate;
    this.startupFenced = opts.onStartupFenced ?? null;
    // Built again when the fencer decides, and when writes start or stop being refused.
    const fence = () => (refusing() ? refusalFence() : gate.fence());
    const planner = new Planner(fence());
    const unwatch = durability?.onChange(() => (planner.fence = fence())) ?? (() => {});
    // A backend lost mid-transaction because a newer leader's raise ended it (raise.ts): the writer
    // hears FP409, as if its next statement had come after the raise.
    const lostReason = async (terminated: boolean): Promise<ErrorFields | null> => {
      const pair = gate.pair();
      if (pair === null) return null;
      const highest = await opts.raisedAbove(pair.fenceKey, pair.token, terminated ? opts.raiseCommitMs : 0);
      if (highest === null) return null;
      opts.onStale({ fenceKey: pair.fenceKey, token: pair.token, highestToken: highest });
      return {
        severity: 'FATAL',
        code: STALE_TOKEN,
        message: `stale fencing token: token ${pair.token} is below the highest token ${highest} of fence key ${JSON.stringify(pair.fenceKey)}`,
        detail: staleDetailText(pair.fenceKey, pair.token, highest),
        hint: "a newer leader raised this fence and ended this session's transaction: nothing of it was applied",
      };
    };
    this.relay = new Relay(client, clientReader, backend, planner, {
      logger: opts.logger,
      gate,
      onStale: opts.onStale,
      ...(opts.onTransactionEnd ? { onTransactionEnd: opts.onTransactionEnd } : {}),
      ...(opts.onFenceError ? { onFenceError: opts.onFenceError } : {}),
      onClose: () => {
        unwatch();
        opts.onClose();
      },
      lostReason,
      idleInTransactionMs: opts.idleInTransactionMs,
    });
  }

  /** Starts relaying (bytes already framed by either reader are processed first), and fences the session for its startup settings. */
  start(): void {
    if (this.startupFenced !== null) this.relay.holdForStartup();
    this.relay.start();
    this.gate.startAhead();
  }
}
