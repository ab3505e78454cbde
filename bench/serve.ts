// `fencepost serve` as a child process for benchmarks, with its RSS readable from /proc.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../tools/zookeeper/local-server.ts';

const BIN = join(import.meta.dirname, '..', 'bin', 'fencepost.js');

export interface ServeProcess {
  url: string;
  pid: number;
  rss(): number;
  stop(): Promise<void>;
}

/** `fenceMode: 'off'` runs the harness's serve with no fence (the unfenced baseline). */
export async function spawnServe(env: Record<string, string>, fenceMode: 'strict' | 'off' = 'strict'): Promise<ServeProcess> {
  const port = await freePort();
  // BENCH_SERVE_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof' profiles the proxy under load.
  const nodeArgs = (process.env.BENCH_SERVE_NODE_ARGS ?? '').split(/\s+/).filter(Boolean);
  const args = [...nodeArgs, ...(fenceMode === 'strict' ? [BIN, 'serve'] : ['--import', 'tsx', join(import.meta.dirname, '..', 'tools', 'cli.ts'), 'serve', '--fence-mode', fenceMode])];
  const child = spawn(process.execPath, args, {
    env: { ...process.env, FENCEPOST_LOG_LEVEL: 'error', ...env, PORT: String(port) },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) throw new Error(`fencepost serve exited: ${err}`);
    if (await fetch(`${url}/readyz`).then((r) => r.ok, () => false)) break;
    if (i > 600) throw new Error(`fencepost serve not ready: ${err}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  return {
    url,
    pid: child.pid!,
    rss: () => {
      try {
        const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'));
        return m ? Number(m[1]) * 1024 : 0;
      } catch {
        return 0;
      }
    },
    stop: async () => {
      child.kill('SIGTERM');
      await exited;
    },
  };
}
