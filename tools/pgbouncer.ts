// A PgBouncer of its own (Debian package `pgbouncer`) in front of a Postgres: transaction pooling,
// SCRAM with that Postgres's user, its ini and userlist in a temp dir. The SQL endpoint's bench
// measures it as the reference protocol proxy; a test checks how the proxy reports one put
// between itself and Postgres. As root it drops to the postgres user (PgBouncer refuses root).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PortTakenError, startOnFreePort, type PortPicking } from '../src/ports.ts';
import { portTakenLine } from './ports.ts';
import { clientConfig, databaseTarget } from '../src/fence/database-url.ts';

/** Debian installs it in /usr/sbin, which a user's PATH may lack. */
const PGBOUNCER = existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer';

export function pgbouncerVersion(): string {
  const r = spawnSync(PGBOUNCER, ['--version'], { encoding: 'utf8' });
  return /PgBouncer (\S+)/.exec(`${r.stdout ?? ''}${r.stderr ?? ''}`)?.[1] ?? 'not installed';
}

/**
 * Resolves once this pgbouncer says it listens on `port` (another process may hold the port) and
 * the port takes connections; a port taken: PortTakenError.
 */
function waitForPort(port: number, timeoutMs: number, child: ChildProcess, what: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    const retry = () => {
      if (Date.now() > deadline) reject(new Error(`pgbouncer not listening within ${timeoutMs} ms: ${what()}`));
      else setTimeout(attempt, 50);
    };
    const attempt = () => {
      const output = what();
      const taken = portTakenLine(output);
      if (taken !== null) return reject(new PortTakenError(`pgbouncer on port ${port}: ${taken}`));
      if (child.exitCode !== null) return reject(new Error(`pgbouncer exited with ${child.exitCode}: ${output}`));
      if (!output.includes(`listening on 127.0.0.1:${port}`)) return retry();
      const s = createConnection({ host: '127.0.0.1', port }, () => {
        s.destroy();
        resolve();
      });
      s.once('error', () => {
        s.destroy();
        retry();
      });
    };
    attempt();
  });
}

/** Its log file (logfile in the ini), where it says why it could not listen. */
function logOf(dir: string): string {
  try {
    return readFileSync(join(dir, 'pgbouncer.log'), 'utf8');
  } catch {
    return '';
  }
}

export interface Bouncer {
  url: string;
  stop(): Promise<void>;
}

/**
 * PgBouncer in transaction pooling in front of `dbUrl`, its ini and userlist in a temp dir, SCRAM
 * with `dbUrl`'s user (its password in the userlist). As root it drops to the postgres
 * user (PgBouncer refuses to run as root).
 */
export async function startPgbouncer(dbUrl: string, poolSize: number, ports?: PortPicking): Promise<Bouncer> {
  return await startOnFreePort((port) => startOn(port, dbUrl, poolSize), ports);
}

async function startOn(port: number, dbUrl: string, poolSize: number): Promise<Bouncer> {
  const upstream = clientConfig(dbUrl);
  const target = databaseTarget(dbUrl);
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-pgbouncer-'));
  const user = upstream.user ?? '';
  writeFileSync(join(dir, 'userlist.txt'), `"${user}" "${String(upstream.password ?? '')}"\n`);
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    `[databases]
* = host=${target.host} port=${target.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = ${join(dir, 'userlist.txt')}
pool_mode = transaction
default_pool_size = ${poolSize}
max_client_conn = ${poolSize * 4}
logfile = ${join(dir, 'pgbouncer.log')}
pidfile = ${join(dir, 'pgbouncer.pid')}
log_connections = 0
log_disconnections = 0
`,
  );
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const ids = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
    const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
    chownSync(dir, Number(ids.stdout.trim()), Number(gid.stdout.trim()));
    for (const f of ['userlist.txt', 'pgbouncer.ini']) chownSync(join(dir, f), Number(ids.stdout.trim()), Number(gid.stdout.trim()));
    chmodSync(dir, 0o700);
  }
  const child = spawn(PGBOUNCER, [...(asRoot ? ['-u', 'postgres'] : []), join(dir, 'pgbouncer.ini')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  child.once('error', (e) => (err += `cannot run pgbouncer (npm run bench installs it: scripts/setup.sh --bench): ${e.message}`));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  try {
    await waitForPort(port, 10_000, child, () => `${err}${logOf(dir)}`);
  } catch (e) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  // Reached where it listens, with the database's name and login.
  const url = `postgres://${encodeURIComponent(user)}:${encodeURIComponent(String(upstream.password ?? ''))}@127.0.0.1:${port}/${encodeURIComponent(target.database)}`;
  return {
    url,
    stop: async () => {
      child.kill('SIGINT');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
