// The fence's second door: what the server's set-up and the CLI need to build a Fence and run the
// database under it (the store and its options, migrations, protected data, client login names,
// the database URL and its hosts, the embedded cluster, durability checks, the rejection log's
// retention). The doors themselves use the front door, index.ts.

// Building the fence.
export type { FenceOptions } from './fence.ts';
export { FenceStore, type FenceStoreOptions, type WriteStrategy } from './store.ts';
export { ROLE_NAME, type LoginSpec } from './client-logins.ts';
export { RejectionPruner } from './retention.ts';

// The schema.
export { migrate } from './migrate.ts';
export { connectionBudget } from './sql/health.ts';

// Reaching Postgres: the URL, the writable primary, pools, the embedded server.
export { checkDatabaseUrl, clientConfig, databaseTarget, describeTarget, primaryFinder, type DatabaseTarget } from './database-url.ts';
export { describeHost, leaveOldHosts, type DatabaseHost } from './primary-finder.ts';
export { hearClientErrors } from './checkout.ts';
export type { RunningPostgres } from './embedded-postgres.ts';
export { runningClusterUrl, runningClusters } from './embedded-cluster.ts';

// Durability: whether a failover keeps every raise.
export { DurabilityMonitor } from './durability-monitor.ts';
export { DURABILITY_REASONS, checkDurability, type DurabilityReport } from './durability.ts';

// Protected data (`fencepost protect`, `fencepost doctor`).
export { ProtectError } from './errors.ts';
export {
  listProtected,
  protectPrefix,
  protectTable,
  protectedDataReport,
  unprotectPrefix,
  unprotectTable,
  type ProtectedDataReport,
} from './protect.ts';
