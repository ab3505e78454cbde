// The SQL endpoint for tests: an in-process proxy (startProxy) over a test database, with
// FENCEPOST_PGWIRE_PORT on a free port, and connection strings for real clients.
import { connect as tcp } from 'node:net';
import pg from 'pg';
import pino, { type Logger } from 'pino';
import { loadConfig } from '../../src/proxy/config.ts';
import { startProxy, type RunningProxy } from '../../src/proxy/server.ts';
import { clientRoleFor, type TestDatabase } from './db.ts';
import { portRangeEnv } from '../../tools/ports.ts';

export interface SqlProxy {
  proxy: RunningProxy;
  port: number;
  /** The database name the endpoint serves. */
  database: string;
  /** A postgres:// URL to the endpoint. */
  url(user: string, opts?: { password?: string; options?: string }): string;
  /** A node-postgres client connected to the endpoint. */
  connect(user: string, opts?: { password?: string; options?: string }): Promise<pg.Client>;
  close(): Promise<void>;
}

/** `opts.logger`: where the proxy logs (default: silent, or FENCEPOST_TEST_LOG's level on stdout). */
export async function startSqlProxy(db: TestDatabase, env: Record<string, string> = {}, opts: { logger?: Logger } = {}): Promise<SqlProxy> {
  const base = {
    DATABASE_URL: db.url,
    PORT: '0',
    FENCEPOST_PGWIRE_PORT: '0',
    FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url),
    FENCEPOST_LOG_LEVEL: 'silent',
    ...portRangeEnv(), // port 0: free ports, of FENCEPOST_PORT_RANGE when set
    ...env,
  };
  const logger = opts.logger ?? pino({ level: process.env.FENCEPOST_TEST_LOG ?? 'silent' });
  const proxy = await startProxy(loadConfig(base), logger);
  const port = proxy.pgwirePort!;
  const database = new URL(db.url).pathname.slice(1);
  const url = (user: string, opts: { password?: string; options?: string } = {}) => {
    const u = new URL(`postgres://127.0.0.1:${port}/${database}`);
    u.username = encodeURIComponent(user);
    if (opts.password !== undefined) u.password = encodeURIComponent(opts.password);
    if (opts.options !== undefined) u.searchParams.set('options', opts.options);
    return u.toString();
  };
  return {
    proxy,
    port,
    database,
    url,
    connect: async (user, opts = {}) => {
      const c = new pg.Client({ connectionString: url(user, opts) });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    close: () => proxy.close(),
  };
}

/** `-c fencepost.token=… -c fencepost.fence_key=…` for startup options (PGOPTIONS). */
export function fenceOptions(token: bigint | number | string, fenceKey: string): string {
  return `-c fencepost.token=${token} -c fencepost.fence_key=${fenceKey.replace(/[\\\s]/g, (c) => `\\${c}`)}`;
}

/** A newer leader's raise of `fenceKey` to `token`, through the HTTP door (`PUT /v1/fences/:key`). */
export async function raiseFence(sql: SqlProxy, fenceKey: string, token: bigint | number): Promise<void> {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token) },
  });
  if (res.status !== 200) throw new Error(`raising ${fenceKey} to ${token}: ${res.status} ${await res.text()}`);
}

export async function fenceRow(pool: pg.Pool, fenceKey: string): Promise<{ highest_token: string } | undefined> {
  const { rows } = await pool.query<{ highest_token: string }>('SELECT highest_token::text FROM fencepost.fences WHERE fence_key = $1', [
    fenceKey,
  ]);
  return rows[0];
}

/** A CancelRequest to the endpoint on `port` for a node-postgres client's session, as a driver sends one. */
export function sendCancel(port: number, client: pg.Client): void {
  tcp({ host: '127.0.0.1', port }).end(cancelPacket(client));
}

/** The CancelRequest packet for a node-postgres client's session. */
export function cancelPacket(client: pg.Client): Buffer {
  const { processID, secretKey } = client as unknown as { processID: number; secretKey: number };
  const packet = Buffer.alloc(16);
  packet.writeInt32BE(16, 0);
  packet.writeInt32BE(80877102, 4);
  packet.writeInt32BE(processID, 8);
  packet.writeInt32BE(secretKey, 12);
  return packet;
}
