// Where a `fencepost serve` listens, from its log: PORT=0 and FENCEPOST_PGWIRE_PORT=0 leave the
// choice to serve (the OS's, or a port of FENCEPOST_PORT_RANGE), and the listening lines (JSON, at
// info) name the ports it bound.

/** What `fencepost serve` logs (JSON, at info) once it listens: the ports it bound, port 0's included. */
export interface ListeningPorts {
  http: number;
  /** null: the SQL endpoint is off. */
  pgwire: number | null;
}

/**
 * The ports in the listening lines of `output` (serve's log), once both are there (`pgwire`: the
 * SQL endpoint was turned on); null before.
 */
export function listeningPorts(output: string, pgwire: boolean): ListeningPorts | null {
  let http: number | null = null;
  let sql: number | null = null;
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue;
    let entry: { msg?: unknown; url?: unknown; port?: unknown };
    try {
      entry = JSON.parse(line) as typeof entry;
    } catch {
      continue;
    }
    if (entry.msg === 'fencepost proxy listening' && typeof entry.url === 'string') http = Number(new URL(entry.url).port);
    if (typeof entry.msg === 'string' && entry.msg.startsWith('fencepost SQL endpoint listening') && typeof entry.port === 'number')
      sql = entry.port;
  }
  if (http === null || (pgwire && sql === null)) return null;
  return { http, pgwire: sql };
}

/** A log level that keeps the listening lines: `level` if it is as verbose as info, else info. */
export function listeningLogLevel(level: string | undefined): string {
  return level === 'trace' || level === 'debug' ? level : 'info';
}
