// The fence's front door: everything outside src/fence (the three doors, the server, the CLI and
// the demo) imports the fence from here and from nowhere else in this folder. What is not listed
// here is the fence's own business.

// Tokens, fence keys and the codes a door answers with.
export { MAX_TOKEN, parseToken, type TokenParse } from './token.ts';
export { MAX_KEY_BYTES, keyProblem } from './key.ts';
export * from './codes.ts';
export * from './sqlstate.ts';
export { CONFLICT_ERROR_CLASSES, RETRYABLE_ERROR_CODES, isUnavailable, sqlState } from './pg-errors.ts';
export { parseStaleDetail, staleDetailText, unverifiedDetailText } from './detail.ts';

// The fence every door calls: client logins, raises, where refusals and commits are recorded.
export { Fence, type FenceOptions } from './fence.ts';
export type { LoginSpec, LoginProblem } from './client-logins.ts';

// The HTTP object door: fenced object writes, reads and fence raises.
export {
  FenceStore,
  type FenceStoreOptions,
  type FenceRecord,
  type FencedOp,
  type FencedResult,
  type OpKind,
  type Precondition,
  type ProtectedPrefix,
  type WriteStrategy,
} from './store.ts';

// The /v1/transactions door.
export { TransactionRunner, type Isolation, type TxFence, type TxStatement } from './transaction.ts';

// What the fence fails with (errors.ts).
export {
  CommitUnknownError,
  ConnectionLostError,
  FenceBusyError,
  FenceHeldByPreparedError,
  LoginUnavailableError,
  NoWritableHostError,
  ProtectError,
  ResultTooLargeError,
  StatementError,
  TransactionEndedError,
  TransactionTimeoutError,
  WriteOutcomeUnknownError,
} from './errors.ts';
export { refusedStatement } from './statement-check.ts';

// The SQL endpoint: the session fence's objects, and the logins writers connect as.
export { NO_PREPARE_READ, NO_PREPARE_SEQUENCE, sessionFenceCapability } from './rule.ts';
export { ROLE_NAME, connectAs, type ProvisionResult } from './client-logins.ts';

// Reaching Postgres: the URL, the writable primary, pools, the embedded server.
export { checkDatabaseUrl, clientConfig, databaseTarget, describeTarget, primaryFinder, type DatabaseTarget } from './database-url.ts';
export { describeHost, leaveOldHosts, type DatabaseHost } from './primary-finder.ts';
export { hearClientErrors } from './checkout.ts';
export type { RunningPostgres } from './embedded-postgres.ts';
export { runningClusterUrl } from './embedded-cluster.ts';

// The schema, health and durability.
export { migrate, migrationsApplied } from './migrate.ts';
export { connectionBudget, writability } from './sql/health.ts';
export { connectionSetup, fenceConnection } from './sql/connection-fence.ts';
export { DurabilityMonitor } from './durability-monitor.ts';
export { DURABILITY_REASONS, checkDurability, type DurabilityReport } from './durability.ts';

// Counts and rejections, for /v1/stats, /metrics and the ops view.
export type { AcceptedCounts } from './accepted-counts.ts';
export type { RejectionLog } from './rejection-log.ts';
export type { Door } from './sql/rejections.ts';
export { readRejectionHistogram, readRejections } from './rejections.ts';
export { RejectionPruner } from './retention.ts';

// Protected data (`fencepost protect`).
export {
  listProtected,
  protectPrefix,
  protectTable,
  protectedDataReport,
  unprotectPrefix,
  unprotectTable,
  type ProtectedDataReport,
} from './protect.ts';
