// Would a Postgres failover keep every fence raise? A fence is only as durable as the commit that
// raised it: a raise acknowledged to its writer but missing on the standby that takes over is lost,
// the fence goes back to the previous token, and a zombie leader holding that token writes again.
// This reads the settings and replication state that decide it and words a warning for each unsafe
// condition, each with a stable reason name. Warnings, not errors: the proxy runs and reports them
// (durability-monitor.ts: on a timer, in the log, /metrics and GET /readyz), and refuses writes
// only when told to (FENCEPOST_REQUIRE_SYNC_STANDBY).
import pg from 'pg';
import * as q from './sql/health.ts';
import { clientConfig } from './database-url.ts';
import { newClient } from './primary-finder.ts';

export type SyncState = 'async' | 'potential' | 'sync' | 'quorum' | 'unknown';

/**
 * Why the fence could be lost (or writes hang), one name per condition:
 * - synchronous_commit_below_on: new sessions' default acknowledges a commit too early.
 * - async_standby: a standby replicates asynchronously; failing over to it can lose commits.
 * - no_sync_standby_streaming: synchronous_standby_names asks for more synchronous standbys than stream: commits hang.
 * - waiting_on_standby: backends have waited on a synchronous standby (wait_event SyncRep) for SYNC_WAIT_REPORT_MS or more.
 * - no_sync_standby: synchronous_standby_names is empty (only when a synchronous standby is required).
 * - check_failed: the check could not read the settings.
 */
export const DURABILITY_REASONS = [
  'synchronous_commit_below_on',
  'async_standby',
  'no_sync_standby_streaming',
  'waiting_on_standby',
  'no_sync_standby',
  'check_failed',
] as const;
export type DurabilityReason = (typeof DURABILITY_REASONS)[number];

export interface Standby {
  /** application_name, as synchronous_standby_names refers to it; null when this role may not read it. */
  name: string | null;
  /** streaming, catchup, …; null when this role may not read it. */
  state: string | null;
  /** `unknown` when this role may not read it (superuser or pg_read_all_stats can). */
  syncState: SyncState;
}

export interface DurabilityReport {
  /** One per unsafe condition, each saying what can be lost and what to change; empty when none. */
  warnings: string[];
  /** The reason of each warning, in the same order. */
  reasons: DurabilityReason[];
  /** Physical standbys streaming from this server; `unknown` when pg_stat_replication could not be read. */
  standbys: Standby[] | 'unknown';
  /** What a new session gets from the server, database and role defaults (not this proxy's forced `on`). */
  synchronousCommit: string;
  /** `""`: no synchronous standby, every standby replicates asynchronously. */
  synchronousStandbyNames: string;
  /** Backends waiting SYNC_WAIT_REPORT_MS or more for a synchronous standby's confirmation; `unknown` when it could not be read. */
  waitingOnStandby: number | 'unknown';
}

export interface DurabilityCheckOptions {
  /** A synchronous standby is required: an empty synchronous_standby_names is a reason too (no_sync_standby). */
  requireSyncStandby?: boolean;
}

/** Bound on connecting and on each query of the check (a diagnostic: it must not hang a start or a probe). */
const CHECK_TIMEOUT_MS = 5000;

const SYNC_STATES: ReadonlySet<string> = new Set(['async', 'potential', 'sync', 'quorum']);

/**
 * A commit waiting this long for its synchronous standby counts as waiting_on_standby: on a
 * healthy standby each commit waits for a round trip and a flush there, far below this.
 */
export const SYNC_WAIT_REPORT_MS = 1000;

/** synchronous_commit values below `on`, and what each acknowledges too early. */
const BELOW_ON: Readonly<Record<string, string>> = {
  off: 'a commit is acknowledged before it is flushed to disk, so a crash of this server, or a failover, can lose it',
  local: 'a commit does not wait for the synchronous standbys, so a failover to one of them can lose it',
  remote_write:
    "a commit waits only until a synchronous standby has written it, not flushed it, so a failover during which that standby's operating system also crashes can lose it",
};

/**
 * Reads the settings on a connection of its own, opened like the pool's (clientConfig: pg-pool
 * hides the password from a spread of its options) but without its startup options: the proxy's pools
 * force synchronous_commit=on for themselves, and the question is what
 * every other session gets. Throws when it cannot connect or read the settings.
 */
export async function checkDurability(pool: pg.Pool, opts: DurabilityCheckOptions = {}): Promise<DurabilityReport> {
  // options ' ', not '': node-postgres takes PGOPTIONS from the proxy's environment for an empty one.
  const client = newClient({
    ...clientConfig(pool.options),
    options: ' ',
    connectionTimeoutMillis: CHECK_TIMEOUT_MS,
    query_timeout: CHECK_TIMEOUT_MS,
  });
  client.on('error', () => {}); // a connection lost while idle: the next query reports it
  await client.connect();
  try {
    const { rows } = await client.query<{ synchronous_commit: string; synchronous_standby_names: string; database: string; role: string }>(
      q.durabilitySettings(),
    );
    const settings = rows[0]!;
    let standbys: Standby[] | 'unknown';
    try {
      const replication = await client.query<{ application_name: string | null; state: string | null; sync_state: string | null }>(
        q.replicationStandbys(),
      );
      standbys = replication.rows.map((r) => ({
        name: r.application_name,
        state: r.state,
        syncState: r.sync_state !== null && SYNC_STATES.has(r.sync_state) ? (r.sync_state as SyncState) : 'unknown',
      }));
    } catch {
      standbys = 'unknown';
    }
    let waitingOnStandby: number | 'unknown';
    try {
      waitingOnStandby = (await client.query<{ waiting: number }>(q.syncRepWaiters(SYNC_WAIT_REPORT_MS))).rows[0]!.waiting;
    } catch {
      waitingOnStandby = 'unknown';
    }
    const report = {
      standbys,
      synchronousCommit: settings.synchronous_commit,
      synchronousStandbyNames: settings.synchronous_standby_names,
      waitingOnStandby,
    };
    const found = durabilityWarnings(report, { database: settings.database, role: settings.role }, opts);
    return { warnings: found.map((w) => w.message), reasons: found.map((w) => w.reason), ...report };
  } finally {
    await client.end().catch(() => {});
  }
}

/** The report when the check itself failed (the caller logs why). */
export function unknownDurability(): DurabilityReport {
  return {
    warnings: [
      'could not read the replication and synchronous_commit settings: whether a Postgres failover keeps every fence raise is unknown',
    ],
    reasons: ['check_failed'],
    standbys: 'unknown',
    synchronousCommit: 'unknown',
    synchronousStandbyNames: 'unknown',
    waitingOnStandby: 'unknown',
  };
}

/** How many synchronous standbys synchronous_standby_names asks for: `FIRST n (…)`, `ANY n (…)`, `n (…)`, else 1. */
export function requiredSyncStandbys(names: string): number {
  const m = /^\s*(?:(?:first|any)\s+)?(\d+)\s*\(/i.exec(names);
  return m ? Number(m[1]) : 1;
}

function durabilityWarnings(
  report: Omit<DurabilityReport, 'warnings' | 'reasons'>,
  where: { database: string; role: string },
  opts: DurabilityCheckOptions,
): { reason: DurabilityReason; message: string }[] {
  const found: { reason: DurabilityReason; message: string }[] = [];
  const warn = (reason: DurabilityReason, message: string) => found.push({ reason, message });
  const noSyncNames = report.synchronousStandbyNames.trim() === '';
  const lost = 'fence raises among them; the fence then goes back and a zombie leader holding the previous token can write again';
  const why = BELOW_ON[report.synchronousCommit];
  if (why !== undefined) {
    warn(
      'synchronous_commit_below_on',
      `synchronous_commit is ${report.synchronousCommit} for new sessions of role "${where.role}" in database "${where.database}" (the server's, database's or role's default): ${why}, ` +
        `${lost}. This proxy's own connections force synchronous_commit=on; sessions that do not set it themselves (other clients and tools writing fences) get ${report.synchronousCommit}. ` +
        `Set the default to on or remote_apply (ALTER DATABASE ... SET synchronous_commit = on, or postgresql.conf).`,
    );
  }
  if (report.standbys !== 'unknown' && report.standbys.length > 0) {
    // With synchronous_standby_names empty every standby is asynchronous, whether or not this role may read sync_state.
    const asynchronous = noSyncNames
      ? report.standbys
      : report.standbys.filter((s) => s.syncState === 'async' || s.syncState === 'potential');
    if (asynchronous.length > 0) {
      const named = asynchronous.map((s) => (s.name === null ? null : `"${s.name}"`)).filter((n) => n !== null);
      const which =
        named.length === asynchronous.length ? named.join(', ') : `${asynchronous.length} (names need pg_read_all_stats to read)`;
      warn(
        'async_standby',
        `asynchronous standby${asynchronous.length === 1 ? '' : 's'} ${which}${noSyncNames ? ' (synchronous_standby_names is empty)' : ''}: ` +
          `a commit is acknowledged before such a standby has it, so failing over to it can lose acknowledged commits, ${lost}. ` +
          `Fail over only to a synchronous standby (one that synchronous_standby_names covers, with synchronous_commit on or remote_apply), or only to a standby that has every acknowledged commit.`,
      );
    }
  }
  if (!noSyncNames && report.standbys !== 'unknown' && report.standbys.every((s) => s.syncState !== 'unknown')) {
    // Every commit of this proxy (synchronous_commit=on) waits for this many to confirm it.
    const needed = requiredSyncStandbys(report.synchronousStandbyNames);
    const streaming = report.standbys.filter((s) => s.state === 'streaming' && (s.syncState === 'sync' || s.syncState === 'quorum')).length;
    if (streaming < needed) {
      warn(
        'no_sync_standby_streaming',
        `synchronous_standby_names is ${JSON.stringify(report.synchronousStandbyNames)} but ${streaming === 0 ? 'no synchronous standby is streaming' : `only ${streaming} of the ${needed} synchronous standbys it asks for ${streaming === 1 ? 'is' : 'are'} streaming`}: ` +
          `every commit that waits for them (this proxy's writes and fence raises among them) hangs until enough stream again. Start or reconnect a standby it names, or change synchronous_standby_names.`,
      );
    }
  }
  if (typeof report.waitingOnStandby === 'number' && report.waitingOnStandby > 0) {
    const n = report.waitingOnStandby;
    warn(
      'waiting_on_standby',
      `${n} backend${n === 1 ? ' has' : 's have'} waited ${SYNC_WAIT_REPORT_MS} ms or more for a synchronous standby to confirm ${n === 1 ? 'its' : 'their'} commit (wait_event SyncRep): ` +
        `such a commit is written here but not acknowledged, and if its wait is cancelled it counts here without being on the standby, so a failover can lose it. ` +
        `See why the synchronous standby does not confirm (pg_stat_replication on this server).`,
    );
  }
  if (opts.requireSyncStandby && noSyncNames) {
    warn(
      'no_sync_standby',
      `no synchronous standby: synchronous_standby_names is empty, so a commit is acknowledged before any standby has it and a failover can lose it, ${lost}. ` +
        `A synchronous standby is required here: name one in synchronous_standby_names (Patroni: synchronous_mode).`,
    );
  }
  return found;
}
