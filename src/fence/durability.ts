// Would a Postgres failover keep every fence raise? A fence is only as durable as the commit that
// raised it: a raise acknowledged to its writer but missing on the standby that takes over is lost,
// the fence goes back to the previous token, and a zombie leader holding that token writes again.
// This reads the settings that decide it and words a warning for each unsafe one. Warnings, not
// errors: the proxy runs, and says so at start (server.ts) and in GET /readyz.
import pg from 'pg';
import * as q from './queries.ts';
import { clientConfig } from './database-url.ts';
import { newClient } from './primary-finder.ts';

export type SyncState = 'async' | 'potential' | 'sync' | 'quorum' | 'unknown';

export interface Standby {
  /** application_name, as synchronous_standby_names refers to it; null when this role may not read it. */
  name: string | null;
  /** streaming, catchup, …; null when this role may not read it. */
  state: string | null;
  /** `unknown` when this role may not read it (superuser or pg_read_all_stats can). */
  syncState: SyncState;
}

export interface DurabilityReport {
  /** One per unsafe setting, each saying what can be lost and what to change; empty when none. */
  warnings: string[];
  /** Physical standbys streaming from this server; `unknown` when pg_stat_replication could not be read. */
  standbys: Standby[] | 'unknown';
  /** What a new session gets from the server, database and role defaults (not this proxy's forced `on`). */
  synchronousCommit: string;
  /** `""`: no synchronous standby, every standby replicates asynchronously. */
  synchronousStandbyNames: string;
}

/** Bound on connecting and on each query of the check (a diagnostic: it must not hang a start or a probe). */
const CHECK_TIMEOUT_MS = 5000;

const SYNC_STATES: ReadonlySet<string> = new Set(['async', 'potential', 'sync', 'quorum']);

/** synchronous_commit values below `on`, and what each acknowledges too early. */
const BELOW_ON: Readonly<Record<string, string>> = {
  off: 'a commit is acknowledged before it is flushed to disk, so a crash of this server, or a failover, can lose it',
  local: 'a commit does not wait for the synchronous standbys, so a failover to one of them can lose it',
  remote_write:
    'a commit waits only until a synchronous standby has written it, not flushed it, so a failover during which that standby\'s operating system also crashes can lose it',
};

/**
 * Reads the settings on a connection of its own, opened like the pool's (clientConfig: pg-pool
 * hides the password from a spread of its options) but without its startup options: the proxy's pools force synchronous_commit=on for themselves, and the question is what
 * every other session gets. Throws when it cannot connect or read the settings.
 */
export async function checkDurability(pool: pg.Pool): Promise<DurabilityReport> {
  // options ' ', not '': node-postgres takes PGOPTIONS from the proxy's environment for an empty one.
  const client = newClient({ ...clientConfig(pool.options), options: ' ', connectionTimeoutMillis: CHECK_TIMEOUT_MS, query_timeout: CHECK_TIMEOUT_MS });
  client.on('error', () => {}); // a connection lost while idle: the next query reports it
  await client.connect();
  try {
    const { rows } = await client.query<{ synchronous_commit: string; synchronous_standby_names: string; database: string; role: string }>(q.durabilitySettings());
    const settings = rows[0]!;
    let standbys: Standby[] | 'unknown';
    try {
      const replication = await client.query<{ application_name: string | null; state: string | null; sync_state: string | null }>(q.replicationStandbys());
      standbys = replication.rows.map((r) => ({
        name: r.application_name,
        state: r.state,
        syncState: r.sync_state !== null && SYNC_STATES.has(r.sync_state) ? (r.sync_state as SyncState) : 'unknown',
      }));
    } catch {
      standbys = 'unknown';
    }
    const report = { standbys, synchronousCommit: settings.synchronous_commit, synchronousStandbyNames: settings.synchronous_standby_names };
    return { warnings: durabilityWarnings(report, { database: settings.database, role: settings.role }), ...report };
  } finally {
    await client.end().catch(() => {});
  }
}

/** The report when the check itself failed (the caller logs why). */
export function unknownDurability(): DurabilityReport {
  return {
    warnings: ['could not read the replication and synchronous_commit settings: whether a Postgres failover keeps every fence raise is unknown'],
    standbys: 'unknown',
    synchronousCommit: 'unknown',
    synchronousStandbyNames: 'unknown',
  };
}

function durabilityWarnings(report: Omit<DurabilityReport, 'warnings'>, where: { database: string; role: string }): string[] {
  const warnings: string[] = [];
  const lost = 'fence raises among them; the fence then goes back and a zombie leader holding the previous token can write again';
  const why = BELOW_ON[report.synchronousCommit];
  if (why !== undefined) {
    warnings.push(
      `synchronous_commit is ${report.synchronousCommit} for new sessions of role "${where.role}" in database "${where.database}" (the server's, database's or role's default): ${why}, ` +
        `${lost}. This proxy's own connections force synchronous_commit=on; sessions that do not set it themselves (other clients and tools writing fences) get ${report.synchronousCommit}. ` +
        `Set the default to on or remote_apply (ALTER DATABASE ... SET synchronous_commit = on, or postgresql.conf).`,
    );
  }
  if (report.standbys !== 'unknown' && report.standbys.length > 0) {
    const noSyncNames = report.synchronousStandbyNames.trim() === '';
    // With synchronous_standby_names empty every standby is asynchronous, whether or not this role may read sync_state.
    const asynchronous = noSyncNames ? report.standbys : report.standbys.filter((s) => s.syncState === 'async' || s.syncState === 'potential');
    if (asynchronous.length > 0) {
      const named = asynchronous.map((s) => (s.name === null ? null : `"${s.name}"`)).filter((n) => n !== null);
      const which = named.length === asynchronous.length ? named.join(', ') : `${asynchronous.length} (names need pg_read_all_stats to read)`;
      warnings.push(
        `asynchronous standby${asynchronous.length === 1 ? '' : 's'} ${which}${noSyncNames ? ' (synchronous_standby_names is empty)' : ''}: ` +
          `a commit is acknowledged before such a standby has it, so failing over to it can lose acknowledged commits, ${lost}. ` +
          `Fail over only to a synchronous standby (one that synchronous_standby_names covers, with synchronous_commit on or remote_apply), or only to a standby that has every acknowledged commit.`,
      );
    }
  }
  return warnings;
}
