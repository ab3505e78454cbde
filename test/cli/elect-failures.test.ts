// `fencepost elect` (and `leader`) failing in one line naming the flag, exit 1, no stack: ZooKeeper
// out of reach, the status port taken, a command that is not there, a --proxy that never answers.
import { afterAll, afterEach, expect, inject, test } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { closedPort, listenFree } from '../../tools/ports.ts';
import { ZkSession } from '../../src/election/zk-session.ts';
import { oneLineFailure, run } from '../support/cli.ts';
import { BIN, spawnProxy } from '../support/proxy.ts';
import { createTestDatabase } from '../support/db.ts';
import { uniquePath, waitFor } from '../support/election.ts';

const zk = inject('zkConnect');
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/** A loopback port held by this process (a free port, of FENCEPOST_PORT_RANGE when set). */
async function occupy(): Promise<{ server: Server; port: number }> {
  const server = createServer();
  return { server, port: await listenFree(server) };
}

/** No pino line carries a stack (`"stack":`), and no plain line looks like one. */
function noStack(stderr: string): void {
  expect(stderr).not.toContain('"stack"');
  expect(stderr).not.toMatch(/^\s+at /m);
}

test('ZooKeeper unreachable: exit 1 after the 5 s it states, one line naming --zk', async () => {
  const at = `127.0.0.1:${await closedPort()}`;
  const began = performance.now();
  const r = run(['elect', '--zk', at, '--path', uniquePath('elect-nozk'), '--', 'true']);
  const tookMs = performance.now() - began;
  expect(oneLineFailure(r)).toBe(`fencepost elect: cannot reach ZooKeeper at ${at} (--zk) within 5 s`);
  noStack(r.stderr);
  // At least the wait it states; the message names the wait it used (ZK_CONNECT_WAIT_MS), so no
  // upper bound on wall-clock time, which a loaded box can miss.
  expect(tookMs).toBeGreaterThanOrEqual(5000);
});

test('--status-port in use: one line naming --status-port, before joining the election', async () => {
  const { server, port } = await occupy();
  const path = uniquePath('elect-status-port');
  try {
    const r = run(['elect', '--zk', zk, '--path', path, '--status-host', '127.0.0.1', '--status-port', String(port), '--', 'true']);
    expect(oneLineFailure(r)).toBe(
      `fencepost elect: --status-port: 127.0.0.1:${port} is already in use (another fencepost elect on this host? pick another --status-port)`,
    );
    noStack(r.stderr);
    expect(run(['leader', '--zk', zk, '--path', path]).status).toBe(4); // never joined: the path was not even created
  } finally {
    server.close();
  }
});

const plain = mkdtempSync(join(tmpdir(), 'fencepost-elect-cmd-'));
afterAll(() => rmSync(plain, { recursive: true, force: true }));
writeFileSync(join(plain, 'not-executable'), '#!/bin/sh\nexit 0\n', { mode: 0o644 });
writeFileSync(join(plain, 'job.sh'), '#!/bin/sh\nexit 7\n', { mode: 0o755 });

test.each([
  ['/no/such/cmd', 'the command "/no/such/cmd" (after --) does not exist'],
  ['no-such-command-on-path-7f3a', 'the command "no-such-command-on-path-7f3a" (after --) is not an executable on PATH'],
  [join(plain, 'not-executable'), `the command ${JSON.stringify(join(plain, 'not-executable'))} (after --) is not executable`],
  [plain, `the command ${JSON.stringify(plain)} (after --) is not a file`],
])('a command that cannot start (%s) is refused in one line before campaigning: no term, no token', (command, why) => {
  const path = uniquePath('elect-nocmd');
  const r = run(['elect', '--zk', zk, '--path', path, '--', command]);
  expect(oneLineFailure(r)).toBe(`fencepost elect: ${why}: nothing started, no election joined`);
  noStack(r.stderr);
  expect(r.stderr).not.toContain('"elected"');
  expect(run(['leader', '--zk', zk, '--path', path]).status).toBe(4); // no candidate node was ever created
});

test('commands found on PATH, and paths relative to the working directory, still run', async () => {
  expect(run(['elect', '--zk', zk, '--path', uniquePath('elect-cmd'), '--', 'sh', '-c', 'exit 5']).status).toBe(5);
  const child = spawn(process.execPath, [BIN, 'elect', '--zk', zk, '--path', uniquePath('elect-cmd'), '--', './job.sh'], {
    cwd: plain,
    stdio: 'ignore',
  });
  children.push(child);
  expect(await new Promise((resolve) => child.once('exit', resolve))).toBe(7);
});

test('a --proxy that never answers: the leader gives up after 5 failed fence advances, says so in one line naming --proxy, exits 1, and the standby takes over at once', async () => {
  const path = uniquePath('elect-badproxy');
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-elect-proxy-'));
  const out = join(dir, 'standby.log');
  try {
    const bad = `http://127.0.0.1:${await closedPort()}`; // nothing listens there
    const a = spawn(
      process.execPath,
      [
        BIN,
        'elect',
        '--zk',
        zk,
        '--path',
        path,
        '--id',
        'a',
        '--session-timeout-ms',
        '20000',
        '--proxy',
        bad,
        '--fence-key',
        'k',
        '--',
        'sh',
        '-c',
        `echo ran-a >> ${out}`,
      ],
      {
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    children.push(a);
    let aErr = '';
    a.stderr!.on('data', (d: Buffer) => (aErr += d.toString()));
    const aExit = new Promise<number | null>((resolve) => a.once('exit', (code) => resolve(code)));
    await waitFor(() => aErr.includes('"msg":"elected"'), 20_000, 'a is elected');
    const b = spawn(process.execPath, [BIN, 'elect', '--zk', zk, '--path', path, '--id', 'b', '--', 'sh', '-c', `echo ran-b >> ${out}`], {
      stdio: 'ignore',
    });
    children.push(b);
    const bExit = new Promise<number | null>((resolve) => b.once('exit', (code) => resolve(code)));
    const code = await aExit;
    const lines = aErr.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{'));
    expect(code, aErr).toBe(1);
    expect(lines, aErr).toEqual([
      `fencepost elect: --proxy ${bad}: the fence advance of "k" failed 5 times in a row (connect ECONNREFUSED ${bad.slice(7)}): left the election so a standby can lead`,
    ]);
    noStack(aErr);
    expect(aErr.match(/fence advance failed; retrying/g)).toHaveLength(4);
    // The standby was elected when a left (not after a's 20 s session timeout) and ran its command.
    expect(await bExit).toBe(0);
    expect(readFileSync(out, 'utf8')).toBe('ran-b\n');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 40_000);

test('an election path created without the credentials: elect exits 1 with the reason (the path\'s ACL), not "not the current leader"', async () => {
  // Invariant: the proxy's forgery guard refuses every token from a path others could write; elect
  // says why in its one line, so the operator fixes the path instead of chasing a leader.
  const path = uniquePath('elect-open-path');
  const open = await ZkSession.open({ connect: zk, sessionTimeoutMs: 4000 });
  await open.mkdirp(path); // as a first run without ZK_AUTH leaves it
  await open.close();
  const db = await createTestDatabase();
  const guarded = { ZK_CONNECT: zk, ZK_AUTH: 'elector:open-path-secret', FENCEPOST_FORGERY_GUARD: JSON.stringify({ 'nightly/': path }) };
  const proxy = await spawnProxy({ DATABASE_URL: db.url, ...guarded });
  try {
    const a = spawn(
      process.execPath,
      [BIN, 'elect', '--zk', zk, '--path', path, '--id', 'a', '--proxy', proxy.url, '--fence-key', 'nightly/report', '--', 'true'],
      {
        env: { ...process.env, ZK_AUTH: guarded.ZK_AUTH, FENCEPOST_LOG_LEVEL: 'warn' },
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    children.push(a);
    let aErr = '';
    a.stderr!.on('data', (d: Buffer) => (aErr += d.toString()));
    const code = await new Promise<number | null>((resolve) => a.once('exit', (c) => resolve(c)));
    const lines = aErr.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{'));
    expect(code, aErr).toBe(1);
    expect(lines, aErr).toHaveLength(1);
    expect(lines[0]).toMatch(
      new RegExp(
        `^fencepost elect: --proxy \\S+ refused the fence advance of "nightly/report": 409 unverified_token: election path ${path} not trusted: created without these credentials \\(ACL\\)`,
      ),
    );
    expect(aErr).not.toContain('not the sequence of the current leader');
    noStack(aErr);
  } finally {
    await proxy.stop();
    await db.drop();
  }
});

test('fencepost leader tells a missing election path (exit 4) from an election nobody leads (exit 3)', async () => {
  const missing = uniquePath('leader-typo');
  const r = run(['leader', '--zk', zk, '--path', missing]);
  expect(r.status).toBe(4);
  expect(r.stderr).toBe(
    `fencepost leader: no election at ${missing}: the path does not exist in ZooKeeper (check --path; it is created when the first candidate joins)\n`,
  );
  const json = run(['leader', '--zk', zk, '--path', missing, '--json']);
  expect(json.status).toBe(4);
  expect(JSON.parse(json.stdout)).toEqual({ electionPath: missing, id: null, token: null, pathExists: false });

  const empty = uniquePath('leader-empty');
  const s = await ZkSession.open({ connect: zk, sessionTimeoutMs: 4000 });
  try {
    await s.mkdirp(empty);
  } finally {
    await s.close();
  }
  const none = run(['leader', '--zk', zk, '--path', empty]);
  expect(none.status).toBe(3);
  expect(none.stderr).toBe(`fencepost leader: nobody leads ${empty} (the election exists; no candidate is in it)\n`);
  expect(JSON.parse(run(['leader', '--zk', zk, '--path', empty, '--json']).stdout)).toEqual({ electionPath: empty, id: null, token: null });
});
