// fencepost's own SQLSTATEs (class FP), raised by its SQL functions (definitions.ts) and answered
// by the doors. Each door maps them to its own answer: HTTP statuses in src/proxy/errors.ts, the
// SQL endpoint passes them through.

/** A stale token: a newer leader holds the fence; nothing of the transaction was applied. */
export const STALE_TOKEN = 'FP409';
/** A malformed `fencepost.token` or `fencepost.fence_key` setting. */
export const INVALID_FENCE_SETTING = 'FP400';
/** The forgery guard could not reach ZooKeeper for this very (fence key, token): safe to retry. */
export const GUARD_UNAVAILABLE = 'FP503';
/**
 * Not raised by a definition: the SQL endpoint's refusal of a fenced transaction while a Postgres
 * failover could lose a fence raise (FENCEPOST_REQUIRE_SYNC_STANDBY; src/proxy/sql/proof.ts).
 * Nothing of the transaction was applied: safe to retry.
 */
export const DURABILITY_UNSAFE = 'FP533';
/** A write to protected data by a transaction that did not pass its fence (src/fence/protect.ts). */
export const NOT_FENCED = 'FP403';
/**
 * A transaction's fence is absent or below its token: the proxy raises it in a transaction of its
 * own and starts again (the doors answer it only when that raise failed); nothing was applied.
 */
export const RAISE_FIRST = 'FP428';
