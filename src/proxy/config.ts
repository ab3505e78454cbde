// Proxy configuration: read once from the environment, validated, frozen. A bad value fails fast
// with a message naming the variable.
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FENCE_MODES, type FenceMode } from '../fence/store.ts';

export interface ProxyConfig {
  /** Postgres to use; null = start an embedded one. */
  databaseUrl: string | null;
  host: string;
  port: number;
  /** Embedded Postgres data folder (only without DATABASE_URL). */
  dataDir: string;
  /** Embedded Postgres port (only without DATABASE_URL). */
  embeddedPgPort: number;
  bodyLimitBytes: number;
  poolSize: number;
  /** Write lanes: fenced batches in flight at once. */
  writeLanes: number;
  /** Most writes coalesced into one statement; 1 = no coalescing. */
  maxBatch: number;
  logLevel: string;
  /** Grace for in-flight requests at shutdown. */
  shutdownTimeoutMs: number;
  /** `strict` unless a benchmark or the checker's self-test asks otherwise. */
  fenceMode: FenceMode;
  /** Rejection log retention: delete rows older than this; 0 = no age limit. */
  rejectionsMaxAgeMs: number;
  /** Rejection log retention: keep at most this many rows (the newest); 0 = no row limit. */
  rejectionsMaxRows: number;
  /** Time between rejection log prune rounds. */
  rejectionsPruneIntervalMs: number;
}

export class ConfigError extends Error {
  constructor(variable: string, message: string) {
    super(`${variable}: ${message}`);
    this.name = 'ConfigError';
  }
}

export const DEFAULT_DATA_DIR = join(tmpdir(), 'fencepost', 'pgdata');

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

function int(env: NodeJS.ProcessEnv, name: string, def: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return def;
  if (!/^\d+$/.test(raw)) throw new ConfigError(name, `must be a whole number, got ${JSON.stringify(raw)}`);
  const n = Number(raw);
  if (n < min || n > max) throw new ConfigError(name, `must be between ${min} and ${max}, got ${n}`);
  return n;
}

function fenceMode(env: NodeJS.ProcessEnv): FenceMode {
  const raw = env.FENCEPOST_UNSAFE_FENCE_MODE;
  if (raw === undefined || raw === '') return 'strict';
  if (!(FENCE_MODES as readonly string[]).includes(raw)) throw new ConfigError('FENCEPOST_UNSAFE_FENCE_MODE', `must be one of ${FENCE_MODES.join(', ')}`);
  return raw as FenceMode;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Readonly<ProxyConfig> {
  const databaseUrl = env.DATABASE_URL ? env.DATABASE_URL : null;
  if (databaseUrl !== null && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    throw new ConfigError('DATABASE_URL', 'must be a postgres:// or postgresql:// URL');
  }
  const logLevel = env.FENCEPOST_LOG_LEVEL ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) throw new ConfigError('FENCEPOST_LOG_LEVEL', `must be one of ${LOG_LEVELS.join(', ')}`);
  const host = env.HOST ?? '127.0.0.1';
  if (host.trim() === '') throw new ConfigError('HOST', 'must not be empty');
  const poolSize = int(env, 'FENCEPOST_POOL_SIZE', 10, 2, 1000);
  const writeLanes = int(env, 'FENCEPOST_WRITE_LANES', Math.max(1, poolSize - 2), 1, 1000);
  if (writeLanes >= poolSize) throw new ConfigError('FENCEPOST_WRITE_LANES', `must be below FENCEPOST_POOL_SIZE (${poolSize}) so reads always find a connection`);
  const rejectionsMaxAgeMs = int(env, 'FENCEPOST_REJECTIONS_MAX_AGE_MS', 7 * 24 * 3600 * 1000, 0, 3650 * 24 * 3600 * 1000);
  const rejectionsMaxRows = int(env, 'FENCEPOST_REJECTIONS_MAX_ROWS', 1_000_000, 0, 1_000_000_000_000);
  if (rejectionsMaxAgeMs === 0 && rejectionsMaxRows === 0) {
    throw new ConfigError('FENCEPOST_REJECTIONS_MAX_ROWS', 'and FENCEPOST_REJECTIONS_MAX_AGE_MS cannot both be 0: the rejection log must be bounded');
  }
  return Object.freeze({
    databaseUrl,
    host,
    port: int(env, 'PORT', 8080, 0, 65535),
    dataDir: env.FENCEPOST_DATA_DIR || DEFAULT_DATA_DIR,
    embeddedPgPort: int(env, 'FENCEPOST_PG_PORT', 54329, 1, 65535),
    bodyLimitBytes: int(env, 'FENCEPOST_BODY_LIMIT_BYTES', 1024 * 1024, 1, 512 * 1024 * 1024),
    poolSize,
    writeLanes,
    maxBatch: int(env, 'FENCEPOST_MAX_BATCH', 64, 1, 10_000),
    logLevel,
    shutdownTimeoutMs: int(env, 'FENCEPOST_SHUTDOWN_TIMEOUT_MS', 10_000, 0, 600_000),
    fenceMode: fenceMode(env),
    rejectionsMaxAgeMs,
    rejectionsMaxRows,
    rejectionsPruneIntervalMs: int(env, 'FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS', 60_000, 100, 24 * 3600 * 1000),
  });
}
