// What every door of one proxy shares, built once (server.ts; buildApp builds its own when run
// alone, as in tests): the fence (src/fence/fence.ts: client logins, raises, where refusals and
// commits go), the token forgery guard, and the log that sums stale refusals. The SQL endpoint
// takes these from here, not from the HTTP app.
import type { Logger } from 'pino';
import { Fence, type TransactionSettings } from '../fence/index.ts';
import { type FenceStore, type LoginSpec } from '../fence/admin.ts';
import { ForgeryGuard, type ForgeryGuardConfig } from './forgery-guard.ts';
import { StaleDigest } from '../logging/stale-digest.ts';
import { LOG_DEFAULTS, TX_DEFAULTS } from './config.ts';
import type { AccessKey } from './access/keys.ts';

export interface SharedParts {
  fence: Fence;
  /** Null when the forgery guard is off. */
  guard: ForgeryGuard | null;
  /** Stale refusals in the log, summed per interval (every door's). */
  staleLog: StaleDigest;
}

export interface SharedPartsOptions {
  store: FenceStore;
  /** The configured keys: each writing key with a pgRole gets a client login; none: open mode. */
  keys: readonly AccessKey[];
  clientRole?: string;
  raiseWaitMs?: number;
  lockTimeoutMs?: number;
  provisionRetryMs?: number;
  /** How /v1/transactions runs; absent: the fence refuses transactions. */
  transactions?: TransactionSettings;
  /** Token forgery guard; null or absent: off. */
  forgeryGuard?: ForgeryGuardConfig | null;
  /** How stale refusals are kept short in the log; default LOG_DEFAULTS. */
  logDigest?: Partial<Record<'staleIntervalMs' | 'staleMaxFenceKeys', number>>;
  logger: Logger | null;
}

/** The client logins for `keys`: one per writing key with a pgRole, or the open-mode login. */
export function loginSpecs(keys: readonly AccessKey[]): LoginSpec[] {
  return keys.length === 0
    ? [{ keyName: null, pgRole: null }]
    : keys.filter((k) => k.pgRole !== null && !k.readOnly).map((k) => ({ keyName: k.name, pgRole: k.pgRole }));
}

export function buildSharedParts(o: SharedPartsOptions): SharedParts {
  const logger = o.logger;
  const fence = new Fence({
    store: o.store,
    ...(o.transactions ? { transactions: o.transactions } : {}),
    clientRole: o.clientRole ?? TX_DEFAULTS.clientRole,
    logins: loginSpecs(o.keys),
    provisionRetryMs: o.provisionRetryMs ?? TX_DEFAULTS.provisionRetryMs,
    raiseWaitMs: o.raiseWaitMs ?? TX_DEFAULTS.raiseWaitMs,
    lockTimeoutMs: o.lockTimeoutMs ?? TX_DEFAULTS.lockTimeoutMs,
    ...(logger
      ? {
          logger,
          onProblem: (keyName, problem) =>
            logger.warn(
              { keyName, login: problem.login, sql: problem.sql },
              `SQL transactions refused until fixed: ${problem.message}${problem.sql.length > 0 ? ` ${problem.sql.join('; ')};` : ''}`,
            ),
        }
      : {}),
  });
  const guard = o.forgeryGuard
    ? new ForgeryGuard({ ...o.forgeryGuard, readHighest: (k) => fence.highestToken(k), ...(logger ? { logger } : {}) })
    : null;
  const logs = { ...LOG_DEFAULTS, ...o.logDigest };
  const staleLog = new StaleDigest(logger, { intervalMs: logs.staleIntervalMs, maxFenceKeys: logs.staleMaxFenceKeys });
  return { fence, guard, staleLog };
}

/** Flushes the stale log, closes the guard's ZooKeeper session and the fence's transaction pools. */
export async function closeSharedParts(s: SharedParts): Promise<void> {
  s.staleLog.flush();
  await s.guard?.close();
  await s.fence.close();
}
