// What a client's startup asks for and what its session starts with: the startup parameters, the
// fencepost settings carried in `options` (`-c fencepost.token=42 -c fencepost.fence_key=orders`,
// i.e. PGOPTIONS), the session timeouts a client may ask for (each at most the proxy's own), the
// backend's settings, and the settings the writer is told.

/**
 * Splits a libpq `options` value into its `-c name=value` / `--name=value` settings (backslash
 * escapes a space or backslash, as Postgres reads it). Other switches are ignored.
 */
export function parseOptions(options: string): Map<string, string> {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  for (let i = 0; i < options.length; i++) {
    const ch = options[i]!;
    if (ch === '\\' && i + 1 < options.length) {
      cur += options[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (inWord) words.push(cur);
  const settings = new Map<string, string>();
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    let setting: string | undefined;
    if (w === '-c') setting = words[++i];
    else if (w.startsWith('-c')) setting = w.slice(2);
    else if (w.startsWith('--')) setting = w.slice(2);
    if (setting === undefined) continue;
    const eq = setting.indexOf('=');
    if (eq <= 0) continue;
    settings.set(setting.slice(0, eq).replaceAll('-', '_').toLowerCase(), setting.slice(eq + 1));
  }
  return settings;
}

/** `-c name=value` for an options string, escaping what Postgres splits on. */
export function optionArg(name: string, value: string): string {
  return `-c ${name}=${value.replace(/[\\\s]/g, (c) => `\\${c}`)}`;
}

/**
 * Startup settings (parameters, or `-c` in `options`) the proxy decides itself and does not pass
 * on: the session's role and read-only default (the fence's), what only a connection's setup may
 * say, and the timeouts the proxy bounds (CLIENT_TIMEOUTS). Everything else a client asks for at
 * startup (`work_mem`, `search_path`, an application's own `myapp.tenant`, …) reaches Postgres,
 * which refuses what it refuses, as it would straight.
 */
export const OWN_SETTINGS: ReadonlySet<string> = new Set([
  'user',
  'database',
  'options',
  'replication',
  'role',
  'session_authorization',
  'default_transaction_read_only',
  'transaction_read_only',
  'statement_timeout',
  'lock_timeout',
  'idle_in_transaction_session_timeout',
]);

/** The fencepost settings a session may carry in from its startup options. */
export const FENCE_SETTINGS: ReadonlySet<string> = new Set(['fencepost.token', 'fencepost.fence_key']);

/** The startup parameters and `options` settings (names lowercased), the parameters winning: Postgres applies them after `options`. */
export function requestedSettings(params: ReadonlyMap<string, string>): Map<string, string> {
  const requested = parseOptions(params.get('options') ?? '');
  for (const [k, v] of params) if (k !== 'options') requested.set(k.toLowerCase(), v);
  return requested;
}

/**
 * The application_name the backend gets: the client's, unchanged, as pg_stat_activity would show
 * it without the proxy (sessions of the endpoint are told apart by their login, `usename`);
 * `fencepost-sql` for a client that names none.
 */
export function applicationName(requested: ReadonlyMap<string, string>): string {
  return requested.get('application_name') || 'fencepost-sql';
}

/** Timeouts a client may set at startup (directly or in `options`); the proxy's own value bounds each. */
export const CLIENT_TIMEOUTS = ['statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout'] as const;
export type ClientTimeout = (typeof CLIENT_TIMEOUTS)[number];

const TIME_UNITS_MS: Readonly<Record<string, number>> = { us: 0.001, ms: 1, s: 1000, min: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * A Postgres time setting in milliseconds, as the server reads one whose unit is ms (`200`,
 * `200ms`, `1.5s`, `2 min`; rounded to a whole ms); null for anything else (negative, another
 * unit, hex, not a number).
 */
export function timeSettingMs(value: string): number | null {
  const m = /^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*(us|ms|s|min|h|d)?\s*$/.exec(value);
  if (!m) return null;
  const ms = Number(`${m[1]}e${m[2] ?? 0}`) * TIME_UNITS_MS[m[3] ?? 'ms']!;
  return Number.isFinite(ms) ? Math.round(ms) : null;
}

/**
 * The timeout a session starts with: what the client asked for when it is a time above 0 and at
 * most the proxy's own; else the proxy's own (a value above it, 0 meaning "none", or one that
 * does not read as a time). `own` null: the proxy sets none, so any positive value is honoured.
 * Null: set nothing.
 */
export function boundedTimeout(requested: string | undefined, own: number | null): number | null {
  const ms = requested === undefined ? null : timeSettingMs(requested);
  if (ms === null || ms <= 0) return own;
  return own === null ? ms : Math.min(ms, own);
}

/** What the backend connection of a session is opened with. */
export interface BackendSettings {
  /** Set as `-c` options: the fence's backstop, the login's role, the fence settings, the bounded timeouts. */
  settings: Map<string, string>;
  /** Startup parameters passed on as the client gave them, with its application_name. */
  forwarded: Map<string, string>;
}

/**
 * The backend settings of a session whose client sent `params`: as the login's `pgRole`, with the
 * client's fence settings (from `options` or a startup parameter of the driver's own: asyncpg
 * server_settings, pgx RuntimeParams), read-only by default without a token (its writes to
 * protected tables are refused by Postgres either way; this is the friendly default), and its
 * timeouts bounded by the proxy's own (`own`; idle_in_transaction_session_timeout by
 * FENCEPOST_PGWIRE_IDLE_IN_TRANSACTION_MS when above 0, else the client's as it asked, or
 * Postgres's). A fenced session's default_transaction_read_only
 * is the client's (off unless it asks).
 */
export function backendSettings(
  params: ReadonlyMap<string, string>,
  pgRole: string | null,
  own: { statementTimeoutMs: number; lockTimeoutMs: number; idleInTransactionMs?: number },
): BackendSettings {
  const requested = requestedSettings(params);
  const token = requested.get('fencepost.token') ?? '';
  const settings = new Map<string, string>([
    ['default_transaction_read_only', token === '' ? 'on' : (requested.get('default_transaction_read_only') ?? 'off')],
  ]);
  if (pgRole !== null) settings.set('role', pgRole);
  for (const [k, v] of requested) if (FENCE_SETTINGS.has(k)) settings.set(k, v);
  const bounds: Record<ClientTimeout, number | null> = {
    statement_timeout: own.statementTimeoutMs,
    lock_timeout: own.lockTimeoutMs,
    idle_in_transaction_session_timeout: own.idleInTransactionMs ? own.idleInTransactionMs : null,
  };
  for (const name of CLIENT_TIMEOUTS) {
    const asked = requested.get(name);
    // No bound of the proxy's: the client's value reaches Postgres as given (0 included), as straight.
    if (bounds[name] === null) {
      if (asked !== undefined) settings.set(name, asked);
      continue;
    }
    const ms = boundedTimeout(asked, bounds[name]);
    if (ms !== null) settings.set(name, String(ms));
  }
  const forwarded = new Map<string, string>();
  for (const [k, v] of requested) if (!OWN_SETTINGS.has(k) && !FENCE_SETTINGS.has(k) && !k.startsWith('_pq_.')) forwarded.set(k, v);
  forwarded.set('application_name', applicationName(requested));
  return { settings, forwarded };
}
