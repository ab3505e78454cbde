// The fence's front door: the doors (HTTP, /v1/transactions, the SQL endpoint) hold one Fence
// (fence.ts) and call its verbs; this is that object, what its verbs take and answer, what they
// fail with, and the codes a door answers with. What the CLI and the server's set-up need
// (migrations, protection, the database URL, the embedded cluster, durability) is the second door,
// admin.ts. Nothing outside src/fence imports any other file of this folder.

// The fence, and what its verbs take and answer.
export { Fence, type FenceHealth, type WriteContext } from './fence.ts';
export type { FencedOp, FencedResult, FenceRecord, OpKind, Precondition } from './store.ts';
export type { ProtectedPrefix } from './protected-prefixes.ts';
export type { Isolation, TransactionSettings, TxFence, TxStatement } from './transaction.ts';
export type { FencePair, FenceSettings, SessionFence, SessionGuard, SessionRefusal } from './session-fence.ts';
export type { Door } from './sql/rejections.ts';

// Tokens and fence keys, as a door checks them before it asks the fence.
export { MAX_TOKEN, parseToken } from './token.ts';
export { keyProblem } from './key.ts';
export { refusedStatement } from './statement-check.ts';
export { quoteBounded } from './session-fence.ts';

// What the verbs fail with (errors.ts), and how a Postgres error is read.
export {
  CommitUnknownError,
  ConnectionLostError,
  FenceBusyError,
  FenceHeldByPreparedError,
  LoginUnavailableError,
  NoWritableHostError,
  ResultTooLargeError,
  StatementError,
  TransactionEndedError,
  TransactionTimeoutError,
  WriteOutcomeUnknownError,
} from './errors.ts';
export { CONFLICT_ERROR_CLASSES, RETRYABLE_ERROR_CODES, isUnavailable, sqlState } from './pg-errors.ts';

// The codes: the fence's own (FP…), and Postgres's SQLSTATEs by name.
export * from './codes.ts';
export * as SQLSTATE from './sqlstate.ts';
