// `fencepost serve` as a child process for benchmarks, with its RSS readable from /proc.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { PortTakenError, startOnFreePorts } from '../src/ports.ts';
import { listensOn, portTakenLine } from '../tools/ports.ts';

const BIN = join(import.meta.dirname, '..', 'bin', 'fencepost.js');

export interface ServeProcess {
  url: string;
  /** The SQL endpoint's port (`pgwire: true`), else null. */
  pgwirePort: number | null;
  pid: number;
  rss(): number;
  stop(): Promise<void>;
}

/**
 * `fenceMode: 'off'` runs the harness's serve with no fence (the unfenced baseline); `pgwire` turns
 * the SQL endpoint on. It logs at error only (what is measured), so its ports are picked, taken again
 * when another process held one (its one-line failure says so), and known to be its own when this
 * process listens on them (/proc).
 */
export async function spawnServe(
  env: Record<string, string>,
  fenceMode: 'strict' | 'off' = 'strict',
  opts: { pgwire?: boolean } = {},
): Promise<ServeProcess> {
  return await startOnFreePorts(opts.pgwire ? 2 : 1, ([port, pgwirePort]) => spawnOn(env, fenceMode, port!, pgwirePort ?? null));
}

async function spawnOn(
  env: Record<string, string>,
  fenceMode: 'strict' | 'off',
  port: number,
  pgwirePort: number | null,
): Promise<ServeProcess> {
  // BENCH_SERVE_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof' profiles the proxy under load.
  const nodeArgs = (process.env.BENCH_SERVE_NODE_ARGS ?? '').split(/\s+/).filter(Boolean);
  const args = [
    ...nodeArgs,
    ...(fenceMode === 'strict'
      ? [BIN, 'serve']
      : ['--import', 'tsx', join(import.meta.dirname, '..', 'tools', 'cli.ts'), 'serve', '--fence-mode', fenceMode]),
  ];
  const child = spawn(process.execPath, args, {
    env: {
      ...process.env,
      FENCEPOST_LOG_LEVEL: 'error',
      ...env,
      PORT: String(port),
      ...(pgwirePort === null ? {} : { FENCEPOST_PGWIRE_PORT: String(pgwirePort) }),
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-65_536)));
  const url = `http://127.0.0.1:${port}`;
  const ours = () => listensOn(child.pid!, port) && (pgwirePort === null || listensOn(child.pid!, pgwirePort));
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) {
      if (child.stderr && !child.stderr.closed) await new Promise((r) => child.stderr!.once('close', r)); // its last words
      const taken = portTakenLine(err);
      throw taken === null ? new Error(`fencepost serve exited: ${err}`) : new PortTakenError(`fencepost serve: ${taken}`);
    }
    if (
      ours() &&
      (await fetch(`${url}/readyz`).then(
        (r) => r.ok,
        () => false,
      ))
    )
      break;
    if (i > 600) {
      child.kill('SIGKILL');
      throw new Error(`fencepost serve not ready: ${err}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  return {
    url,
    pgwirePort,
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
