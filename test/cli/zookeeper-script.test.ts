// scripts/zookeeper.sh, the ZooKeeper of the elect walkthrough: prints a connect string that works,
// and takes its server down with it on SIGTERM.
import { expect, test } from 'vitest';
import { spawn, spawnSync } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { ZkSession } from '../../src/election/zk-session.ts';
import { REPO } from '../support/proxy.ts';
import { run } from '../support/cli.ts';
import { freePort } from '../../src/ports.ts';

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
}

test('prints ZK_CONNECT of a standalone server, on a port of FENCEPOST_PORT_RANGE, that fencepost and a ZooKeeper client can use; SIGTERM stops it', async () => {
  const lo = Math.min(await freePort(), 65_535 - 99);
  const env = { ...process.env, FENCEPOST_PORT_RANGE: `${lo}-${lo + 99}` };
  const child = spawn(join(REPO, 'scripts', 'zookeeper.sh'), [], { stdio: ['ignore', 'pipe', 'pipe'], env });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  try {
    await expect.poll(() => out, { timeout: 60_000, interval: 100 }).toMatch(/^ZK_CONNECT=127\.0\.0\.1:\d+\n$/);
    const zk = out.trim().slice('ZK_CONNECT='.length);
    const port = Number(zk.split(':')[1]);
    expect(port >= lo && port <= lo + 99, `${port} in ${env.FENCEPOST_PORT_RANGE}`).toBe(true);
    const s = await ZkSession.open({ connect: zk, sessionTimeoutMs: 4000 });
    try {
      await s.mkdirp('/walkthrough/nightly');
    } finally {
      await s.close();
    }
    const r = run(['leader', '--zk', zk, '--path', '/walkthrough/nightly']);
    expect(r.status, r.stderr).toBe(3); // reached it: the path is there, nobody leads
    child.kill('SIGTERM');
    expect(await exited, err).toBe(0);
    expect(err).toContain('stopping the server and removing its data');
    expect(await accepts(port)).toBe(false); // the JVM went with it
  } finally {
    if (child.exitCode === null) child.kill('SIGKILL');
  }
}, 90_000);

test('a malformed FENCEPOST_PORT_RANGE: exit 2, one line naming the variable, no server', () => {
  const r = spawnSync(join(REPO, 'scripts', 'zookeeper.sh'), [], {
    env: { ...process.env, FENCEPOST_PORT_RANGE: '30000:30100' },
    encoding: 'utf8',
    timeout: 60_000,
  });
  expect(r.status).toBe(2);
  expect(r.stdout).toBe('');
  expect(r.stderr).toContain('zookeeper: FENCEPOST_PORT_RANGE: must be <low>-<high>, e.g. 20000-20999; got "30000:30100"\n');
});
