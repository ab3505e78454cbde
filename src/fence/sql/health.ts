// The database's health as the proxy reads it: writability, the connection budget, and the
// synchronous-standby state the durability check needs.
import type { Query } from './query.ts';

/** Whether the database takes writes: in recovery (a standby), or read-only by default. */
export function writability(): Query {
  return {
    name: 'fencepost_writability',
    text: "SELECT pg_is_in_recovery() AS recovery, current_setting('default_transaction_read_only') AS read_only",
  };
}

/** Postgres's max_connections and the connections it keeps for superusers. */
export function connectionBudget(): Query {
  return {
    name: 'fencepost_connection_budget',
    text: "SELECT current_setting('max_connections')::int AS max, current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved",
  };
}

/**
 * The settings a Postgres failover's safety depends on, as a new session of this role in this
 * database gets them: run on a connection opened without the proxy's forced options (durability.ts).
 */
export function durabilitySettings(): Query {
  return {
    text: `SELECT current_setting('synchronous_commit') AS synchronous_commit,
  current_setting('synchronous_standby_names') AS synchronous_standby_names,
  current_database() AS database, current_user AS role`,
  };
}

/**
 * Physical standbys streaming from this server, the possible failover targets (a logical walsender
 * is connected to a database; a physical one is not). Without pg_read_all_stats, every column but
 * pid reads null.
 */
export function replicationStandbys(): Query {
  return {
    text: `SELECT r.application_name, r.state, r.sync_state
FROM pg_stat_replication r LEFT JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datname IS NULL
ORDER BY r.application_name, r.pid`,
  };
}

/**
 * Backends waiting this long or longer for a synchronous standby to confirm their commit
 * (wait_event SyncRep): written here, not yet acknowledged. A commit waits so briefly on a healthy
 * standby that a shorter wait is not counted. Without pg_read_all_stats, other roles' backends
 * read a null wait_event and are not counted.
 */
export function syncRepWaiters(minWaitMs: number): Query {
  return {
    text: `SELECT count(*)::int AS waiting FROM pg_stat_activity
WHERE wait_event_type = 'IPC' AND wait_event = 'SyncRep' AND clock_timestamp() - coalesce(query_start, backend_start) >= make_interval(secs => $1::float8 / 1000)`,
    values: [minWaitMs],
  };
}
