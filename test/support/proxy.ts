// Proxy instances for tests: in-process (buildApp over a test database) or as real processes.
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import type pg from 'pg';
import { buildApp } from '../../src/proxy/app.ts';
import { FenceStore, type FenceStoreOptions } from '../../src/fence/store.ts';
import { freePort } from '../../tools/zookeeper/local-server.ts';
import { clientRoleFor } from './db.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import type { FenceMode } from '../../tools/unsafe-fence.ts';

export const REPO = join(import.meta.dirname, '..', '..');
export const BIN = join(REPO, 'bin', 'fencepost.js');

export function testApp(pool: pg.Pool, opts: Partial<FenceStoreOptions> & { bodyLimitBytes?: number } = {}): FastifyInstance {
  return buildApp({ store: new FenceStore(pool, { ...STORE_DEFAULTS, ...opts }), bodyLimitBytes: opts.bodyLimitBytes ?? 1024 * 1024, transactions: { clientRole: clientRoleFor(pool) } });
}

/** Listens on a free loopback port; returns the base URL. */
export async function listen(app: FastifyInstance): Promise<string> {
  return await app.listen({ host: '127.0.0.1', port: 0 });
}

export interface ProxyProcess {
  url: string;
  child: ChildProcess;
  output(): string;
  /** Sends the signal and resolves with the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Runs `fencepost serve` as a real process and waits until /readyz answers 200. `fenceMode` other
 * than strict runs the harness's serve with a broken fence instead (tools/unsafe-fence.ts).
 */
export async function spawnProxy(env: Record<string, string>, timeoutMs = 60_000, fenceMode: FenceMode = 'strict'): Promise<ProxyProcess> {
  const port = env.PORT ? Number(env.PORT) : await freePort();
  const args = fenceMode === 'strict' ? [BIN, 'serve'] : ['--import', 'tsx', join(REPO, 'tools', 'cli.ts'), 'serve', '--fence-mode', fenceMode];
  const child = spawn(process.execPath, args, {
    env: {
      ...process.env,
      FENCEPOST_LOG_LEVEL: 'warn',
      ...(env.DATABASE_URL ? { FENCEPOST_CLIENT_ROLE: clientRoleFor(env.DATABASE_URL) } : {}),
      ...env,
      PORT: String(port),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`fencepost serve exited with ${child.exitCode}:\n${out}`);
    const ok = await fetch(`${url}/readyz`).then((r) => r.ok, () => false);
    if (ok) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`fencepost serve not ready after ${timeoutMs} ms:\n${out}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    child,
    output: () => out,
    stop: async (signal = 'SIGTERM') => {
      if (child.exitCode === null) child.kill(signal);
      return await exited;
    },
  };
}
