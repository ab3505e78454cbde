// A real single-member etcd (Debian's `etcd-server`) for a test file: free loopback ports, a temp
// data dir, removed on stop. scripts/setup.sh --test installs it, with `etcdctl` (`etcd-client`).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { PortTakenError, startOnFreePorts } from '../../src/ports.ts';

export const ETCD = process.env.ETCD ?? 'etcd';
export const ETCDCTL = process.env.ETCDCTL ?? 'etcdctl';

/** null when both binaries run, else a message naming what to install. */
export function etcdInstalled(): string | null {
  for (const [bin, arg] of [
    [ETCD, '--version'],
    [ETCDCTL, 'version'],
  ] as const) {
    if (spawnSync(bin, [arg], { encoding: 'utf8' }).error !== undefined) {
      return `${bin} is not installed: run scripts/setup.sh --test (apt-get install etcd-server etcd-client)`;
    }
  }
  return null;
}

export interface LocalEtcd {
  /** The client URL, e.g. `http://127.0.0.1:23790`: what ETCDCTL_ENDPOINTS takes. */
  readonly endpoint: string;
  /** Stops etcd and removes its data dir. */
  stop(): Promise<void>;
}

/**
 * Starts etcd on two picked ports (client, peer). Another process can take a port between the pick
 * and etcd's bind: then etcd exits at once saying so, and the start is tried again on other ports.
 */
export async function startEtcd(opts: { log?: (line: string) => void; attempts?: number; timeoutMs?: number } = {}): Promise<LocalEtcd> {
  return await startOnFreePorts(
    2,
    async ([client, peer]) => {
      const dir = mkdtempSync(join(tmpdir(), 'fencepost-etcd-'));
      try {
        return await startOnce(dir, client!, peer!, opts.log ?? (() => {}), opts.timeoutMs ?? 30_000);
      } catch (e) {
        rmSync(dir, { recursive: true, force: true });
        const err = e instanceof Error ? e : new Error(String(e));
        throw /address already in use/.test(err.message) ? new PortTakenError(err.message, { cause: err }) : err;
      }
    },
    opts.attempts === undefined ? {} : { attempts: opts.attempts },
  );
}

async function startOnce(
  dir: string,
  clientPort: number,
  peerPort: number,
  log: (line: string) => void,
  timeoutMs: number,
): Promise<LocalEtcd> {
  const endpoint = `http://127.0.0.1:${clientPort}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  const child: ChildProcess = spawn(
    ETCD,
    [
      '--name',
      'test',
      '--data-dir',
      join(dir, 'data'),
      '--listen-client-urls',
      endpoint,
      '--advertise-client-urls',
      endpoint,
      '--listen-peer-urls',
      peer,
      '--initial-advertise-peer-urls',
      peer,
      '--initial-cluster',
      `test=${peer}`,
      '--logger',
      'zap',
      '--log-level',
      'warn',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  const onData = (b: Buffer) => {
    out += b.toString();
    log(b.toString().trimEnd());
  };
  child.stdout?.on('data', onData);
  child.stderr?.on('data', onData);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const closed = new Promise<void>((resolve) => child.once('close', () => resolve())); // its output read to the end
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  // Serving once /health says so (a single member elects itself within an election timeout).
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      await closed;
      throw new Error(`etcd exited during start:\n${out}`);
    }
    const healthy = await fetch(`${endpoint}/health`).then(
      async (r) => r.ok && ((await r.json()) as { health?: string }).health === 'true',
      () => false,
    );
    if (healthy) return { endpoint, stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`etcd did not become healthy within ${timeoutMs} ms:\n${out}`);
    }
    await sleep(100);
  }
}
