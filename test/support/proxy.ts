// Proxy instances for tests: in-process (buildApp over a test database) or as real processes.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { request as httpsRequest } from 'node:https';
import type { TLSSocket } from 'node:tls';
import type { FastifyInstance } from 'fastify';
import type pg from 'pg';
import { buildApp } from '../../src/proxy/http/app.ts';
import { FenceStore, type FenceStoreOptions } from '../../src/fence/store.ts';
import { clientRoleFor } from './db.ts';
import { listeningLogLevel, listeningPorts, type ListeningPorts } from '../../tools/serve-listening.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import type { FenceMode } from '../../tools/unsafe-fence.ts';
import type { DurabilityMonitor } from '../../src/fence/durability-monitor.ts';
import { onFreePort } from '../../tools/ports.ts';

export const REPO = join(import.meta.dirname, '..', '..');
export const BIN = join(REPO, 'bin', 'fencepost.js');

export function testApp(
  pool: pg.Pool,
  opts: Partial<FenceStoreOptions> & { bodyLimitBytes?: number; protectedPrefixRefreshMs?: number; durability?: DurabilityMonitor } = {},
): FastifyInstance {
  const { bodyLimitBytes, protectedPrefixRefreshMs, durability, ...store } = opts;
  return buildApp({
    store: new FenceStore(pool, { ...STORE_DEFAULTS, ...store }),
    bodyLimitBytes: bodyLimitBytes ?? 1024 * 1024,
    transactions: { clientRole: clientRoleFor(pool) },
    ...(protectedPrefixRefreshMs === undefined ? {} : { protectedPrefixRefreshMs }),
    ...(durability === undefined ? {} : { durability }),
  });
}

/** Listens on a free loopback port (from FENCEPOST_PORT_RANGE when set); returns the base URL. */
export async function listen(app: FastifyInstance): Promise<string> {
  return await onFreePort((port) => app.listen({ host: '127.0.0.1', port }));
}

export interface ProxyProcess {
  url: string;
  /** The SQL endpoint's port, when FENCEPOST_PGWIRE_PORT turned it on. */
  pgwirePort: number | null;
  child: ChildProcess;
  output(): string;
  /** Sends the signal and resolves with the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

export interface SpawnProxyOptions {
  /** The proxy serves HTTPS (FENCEPOST_TLS_CERT / _KEY in env): readiness is checked trusting `ca`. */
  https?: { ca: string | Buffer | Array<string | Buffer> };
  /** Another checkout's bin/fencepost.js (default: this one's). */
  bin?: string;
}

/** GET over HTTPS trusting `ca`; also reports the certificate the server presented. */
export function httpsGet(
  url: string,
  ca: string | Buffer | Array<string | Buffer>,
): Promise<{ status: number; body: string; fingerprint256: string }> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(url, { ca, agent: false }, (res) => {
      const fingerprint256 = (res.socket as TLSSocket).getPeerCertificate().fingerprint256;
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, fingerprint256 }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * Waits until a `fencepost serve` whose log `output()` returns has logged where it listens and
 * answers /readyz there; its HTTP base URL. Throws when it exits first, or after `timeoutMs`.
 */
export async function readyUrl(child: ChildProcess, output: () => string, timeoutMs = 60_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`fencepost serve exited with ${child.exitCode}:\n${output()}`);
    const ports = listeningPorts(output(), false);
    const url = ports === null ? null : `http://127.0.0.1:${ports.http}`;
    if (
      url !== null &&
      (await fetch(`${url}/readyz`).then(
        (r) => r.ok,
        () => false,
      ))
    )
      return url;
    if (Date.now() > deadline) throw new Error(`fencepost serve not ready after ${timeoutMs} ms:\n${output()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Runs `fencepost serve` as a real process and waits until /readyz answers 200. It listens where
 * env says, on free ports by default (PORT=0; FENCEPOST_PGWIRE_PORT=0 for the SQL endpoint: serve
 * takes them from FENCEPOST_PORT_RANGE when set), read back from its listening lines (so it logs
 * at info at least). `fenceMode` other
 * than strict runs the harness's serve with a broken fence instead (tools/unsafe-fence.ts).
 */
export async function spawnProxy(
  env: Record<string, string>,
  timeoutMs = 60_000,
  fenceMode: FenceMode = 'strict',
  opts: SpawnProxyOptions = {},
): Promise<ProxyProcess> {
  const args =
    fenceMode === 'strict'
      ? [opts.bin ?? BIN, 'serve']
      : ['--import', 'tsx', join(REPO, 'tools', 'cli.ts'), 'serve', '--fence-mode', fenceMode];
  const child = spawn(process.execPath, args, {
    env: {
      ...process.env,
      ...(env.DATABASE_URL ? { FENCEPOST_CLIENT_ROLE: clientRoleFor(env.DATABASE_URL) } : {}),
      ...env,
      PORT: env.PORT || '0',
      FENCEPOST_LOG_LEVEL: listeningLogLevel(env.FENCEPOST_LOG_LEVEL),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const pgwire = env.FENCEPOST_PGWIRE_PORT !== undefined && env.FENCEPOST_PGWIRE_PORT !== '';
  const deadline = Date.now() + timeoutMs;
  let url = '';
  let ports: ListeningPorts | null = null;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`fencepost serve exited with ${child.exitCode}:\n${out}`);
    ports ??= listeningPorts(out, pgwire);
    if (ports !== null) {
      url = `${opts.https ? 'https' : 'http'}://127.0.0.1:${ports.http}`;
      const ok = opts.https
        ? await httpsGet(`${url}/readyz`, opts.https.ca).then(
            (r) => r.status === 200,
            () => false,
          )
        : await fetch(`${url}/readyz`).then(
            (r) => r.ok,
            () => false,
          );
      if (ok) break;
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`fencepost serve not ready after ${timeoutMs} ms:\n${out}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    pgwirePort: ports.pgwire,
    child,
    output: () => out,
    stop: async (signal = 'SIGTERM') => {
      if (child.exitCode === null) child.kill(signal);
      return await exited;
    },
  };
}
