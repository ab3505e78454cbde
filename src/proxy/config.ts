// Proxy configuration: read once from the environment, validated, frozen. A bad value fails fast
// with a message naming the variable.
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isIP } from 'node:net';
import { parseKeys, type AccessKey } from './auth.ts';
import type { ForgeryGuardConfig } from './forgery-guard.ts';
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
  /** Bound on each statement of the fenced write path and reads (0 = none). */
  statementTimeoutMs: number;
  /** Fenced write batches (statements) in flight at once. */
  writeConcurrency: number;
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
  /** Bearer keys (FENCEPOST_KEYS_FILE or FENCEPOST_KEYS); empty = the proxy runs open. */
  keys: readonly AccessKey[];
  /** Reads: open, or any configured key (default when keys are configured). */
  readAccess: 'open' | 'key';
  /** FENCEPOST_ALLOW_OPEN=1: no keys, yet bind a non-loopback HOST. */
  allowOpen: boolean;
  /** Whole request (headers and body) must arrive within this; else 408 and the connection closes. */
  requestTimeoutMs: number;
  /** Token forgery guard; null = off. */
  forgeryGuard: ForgeryGuardConfig | null;
  /** POST /v1/transactions: connections of its own pool, statements, timeout, retries. */
  txPoolSize: number;
  txMaxStatements: number;
  txStatementTimeoutMs: number;
  txRetries: number;
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

/** Loopback addresses: binding one of these without keys is safe. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || /^::ffff:127\./i.test(h);
  return false;
}

/** With no keys the proxy is open to anyone who can reach it: only loopback, unless allowed. */
export function assertSafeBind(config: Pick<ProxyConfig, 'host' | 'keys' | 'allowOpen'>): void {
  if (config.keys.length === 0 && !config.allowOpen && !isLoopbackHost(config.host)) {
    throw new ConfigError(
      'HOST',
      `${config.host} is not a loopback address and no keys are configured (FENCEPOST_KEYS_FILE / FENCEPOST_KEYS): anyone could write; configure keys or set FENCEPOST_ALLOW_OPEN=1`,
    );
  }
}

function loadKeys(env: NodeJS.ProcessEnv): AccessKey[] {
  const file = env.FENCEPOST_KEYS_FILE;
  const inline = env.FENCEPOST_KEYS;
  if (file && inline) throw new ConfigError('FENCEPOST_KEYS', 'set FENCEPOST_KEYS or FENCEPOST_KEYS_FILE, not both');
  const variable = file ? 'FENCEPOST_KEYS_FILE' : 'FENCEPOST_KEYS';
  let json: string;
  if (file) {
    try {
      json = readFileSync(file, 'utf8');
    } catch (err) {
      throw new ConfigError(variable, `cannot read ${file}: ${(err as Error).message}`);
    }
  } else if (inline) json = inline;
  else return [];
  try {
    return parseKeys(json);
  } catch (err) {
    throw new ConfigError(variable, (err as Error).message);
  }
}

function loadForgeryGuard(env: NodeJS.ProcessEnv): ForgeryGuardConfig | null {
  const raw = env.FENCEPOST_FORGERY_GUARD;
  if (!raw) return null;
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch {
    throw new ConfigError('FENCEPOST_FORGERY_GUARD', 'must be JSON: {"<fence-key prefix>": "<election path>", …}');
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc) || Object.keys(doc).length === 0) {
    throw new ConfigError('FENCEPOST_FORGERY_GUARD', 'must be a non-empty JSON object {"<fence-key prefix>": "<election path>", …}');
  }
  const mappings = Object.entries(doc).map(([prefix, electionPath]) => {
    if (typeof electionPath !== 'string' || !electionPath.startsWith('/') || electionPath.endsWith('/') || electionPath.includes('//')) {
      throw new ConfigError('FENCEPOST_FORGERY_GUARD', `election path for ${JSON.stringify(prefix)} must be an absolute ZooKeeper path without a trailing slash`);
    }
    return Object.freeze({ prefix, electionPath });
  });
  const zkConnect = env.ZK_CONNECT;
  if (!zkConnect) throw new ConfigError('ZK_CONNECT', 'is required when FENCEPOST_FORGERY_GUARD is set');
  return Object.freeze({ zkConnect, mappings: Object.freeze(mappings) });
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
  const writeConcurrency = int(env, 'FENCEPOST_WRITE_CONCURRENCY', Math.min(2, poolSize - 1), 1, 1000);
  if (writeConcurrency >= poolSize) throw new ConfigError('FENCEPOST_WRITE_CONCURRENCY', `must be below FENCEPOST_POOL_SIZE (${poolSize}) so reads always find a connection`);
  const rejectionsMaxAgeMs = int(env, 'FENCEPOST_REJECTIONS_MAX_AGE_MS', 7 * 24 * 3600 * 1000, 0, 3650 * 24 * 3600 * 1000);
  const rejectionsMaxRows = int(env, 'FENCEPOST_REJECTIONS_MAX_ROWS', 1_000_000, 0, 1_000_000_000_000);
  if (rejectionsMaxAgeMs === 0 && rejectionsMaxRows === 0) {
    throw new ConfigError('FENCEPOST_REJECTIONS_MAX_ROWS', 'and FENCEPOST_REJECTIONS_MAX_AGE_MS cannot both be 0: the rejection log must be bounded');
  }
  const keys = loadKeys(env);
  const readAccess = env.FENCEPOST_READ_ACCESS || (keys.length > 0 ? 'key' : 'open');
  if (readAccess !== 'open' && readAccess !== 'key') throw new ConfigError('FENCEPOST_READ_ACCESS', 'must be open or key');
  if (readAccess === 'key' && keys.length === 0) throw new ConfigError('FENCEPOST_READ_ACCESS', 'key needs keys (FENCEPOST_KEYS_FILE / FENCEPOST_KEYS)');
  const allowOpenRaw = env.FENCEPOST_ALLOW_OPEN ?? '';
  if (!['', '0', '1'].includes(allowOpenRaw)) throw new ConfigError('FENCEPOST_ALLOW_OPEN', 'must be 0 or 1');
  const allowOpen = allowOpenRaw === '1';
  assertSafeBind({ host, keys, allowOpen });
  return Object.freeze({
    databaseUrl,
    host,
    port: int(env, 'PORT', 8080, 0, 65535),
    dataDir: env.FENCEPOST_DATA_DIR || DEFAULT_DATA_DIR,
    embeddedPgPort: int(env, 'FENCEPOST_PG_PORT', 54329, 1, 65535),
    bodyLimitBytes: int(env, 'FENCEPOST_BODY_LIMIT_BYTES', 1024 * 1024, 1, 512 * 1024 * 1024),
    poolSize,
    writeConcurrency,
    statementTimeoutMs: int(env, 'FENCEPOST_STATEMENT_TIMEOUT_MS', 10_000, 0, 3_600_000),
    maxBatch: int(env, 'FENCEPOST_MAX_BATCH', 64, 1, 10_000),
    logLevel,
    shutdownTimeoutMs: int(env, 'FENCEPOST_SHUTDOWN_TIMEOUT_MS', 10_000, 0, 600_000),
    fenceMode: fenceMode(env),
    rejectionsMaxAgeMs,
    rejectionsMaxRows,
    rejectionsPruneIntervalMs: int(env, 'FENCEPOST_REJECTIONS_PRUNE_INTERVAL_MS', 60_000, 100, 24 * 3600 * 1000),
    keys: Object.freeze(keys),
    readAccess,
    allowOpen,
    requestTimeoutMs: int(env, 'FENCEPOST_REQUEST_TIMEOUT_MS', 30_000, 100, 3_600_000),
    forgeryGuard: loadForgeryGuard(env),
    txPoolSize: int(env, 'FENCEPOST_TX_POOL_SIZE', 4, 1, 1000),
    txMaxStatements: int(env, 'FENCEPOST_TX_MAX_STATEMENTS', 100, 1, 10_000),
    txStatementTimeoutMs: int(env, 'FENCEPOST_TX_STATEMENT_TIMEOUT_MS', 5000, 1, 3_600_000),
    txRetries: int(env, 'FENCEPOST_TX_RETRIES', 3, 0, 100),
  });
}
