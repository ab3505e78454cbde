// Crash failover with a real SIGKILL: a leader runs as a `fencepost elect` process, is killed with
// SIGKILL (elect and its command), and a standby in this process measures the time to its 'elected'.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Election } from '../src/election/election.ts';
import { distribution, type Distribution } from '../src/election/advice.ts';

const BIN = join(import.meta.dirname, '..', 'bin', 'fencepost.js');

export async function benchSigkillFailover(connect: string, sessionTimeoutMs: number, rounds: number): Promise<Distribution> {
  const samples: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const path = `/fencepost-bench/sigkill-${process.pid}-${i}-${Date.now()}`;
    // The leader process joins first, so it leads; the standby joins behind it.
    const leader = spawn(
      process.execPath,
      [
        BIN,
        'elect',
        '--zk',
        connect,
        '--path',
        path,
        '--id',
        'leader',
        '--session-timeout-ms',
        String(sessionTimeoutMs),
        '--',
        'sleep',
        '600',
      ],
      {
        stdio: ['ignore', 'ignore', 'pipe'],
        detached: true,
      },
    );
    let log = '';
    leader.stderr?.on('data', (d: Buffer) => (log += d.toString()));
    const deadline = Date.now() + 30_000;
    while (!log.includes('started the command')) {
      if (Date.now() > deadline || leader.exitCode !== null) throw new Error(`leader never started:\n${log}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const standby = new Election({ connect, path, id: 'standby', sessionTimeoutMs });
    await standby.start();
    const elected = new Promise<number>((resolve) => standby.once('elected', () => resolve(performance.now())));
    const childPid = Number(/"childPid":(\d+)/.exec(log)?.[1]);
    const killedAt = performance.now();
    process.kill(-leader.pid!, 'SIGKILL'); // elect's own group
    if (childPid) process.kill(-childPid, 'SIGKILL'); // its command runs in a group of its own
    samples.push((await elected) - killedAt);
    await standby.close();
  }
  return distribution(samples);
}
