// `fencepost elect` end to end: real `node bin/fencepost.js elect` processes against real ZooKeeper.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, afterEach, expect, inject, test } from 'vitest';
import { TcpProxy } from '../../tools/faults/tcp-proxy.ts';
import { uniquePath, waitFor } from './helpers.ts';

const connect = inject('zkConnect');
const BIN = resolve(import.meta.dirname, '../../bin/fencepost.js');
const dir = mkdtempSync(join(tmpdir(), 'fencepost-elect-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// The command run under election: records start/stop with its token in $OUT; exits when orphaned.
const CHILD = `
const fs = require('fs'); const out = process.env.OUT; const parent = process.ppid;
fs.appendFileSync(out, 'start ' + process.env.FENCING_TOKEN + ' ' + process.env.ELECTION_ID + ' ' + process.pid + ' ' + process.env.ELECTION_PATH + '\\n');
process.on('SIGTERM', () => {
  if (process.env.IGNORE_TERM) { fs.appendFileSync(out, 'ignored-term ' + process.env.FENCING_TOKEN + '\\n'); return; }
  fs.appendFileSync(out, 'stop ' + process.env.FENCING_TOKEN + '\\n'); process.exit(0);
});
setInterval(() => { if (process.ppid !== parent) process.exit(0); }, 100);
`;

interface Proc {
  child: ChildProcess;
  logs: Array<Record<string, unknown>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}
const procs: Proc[] = [];
const pidsToReap = new Set<number>();
afterEach(() => {
  for (const p of procs.splice(0)) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
  for (const pid of pidsToReap) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  pidsToReap.clear();
});

function elect(args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(process.execPath, [BIN, 'elect', ...args], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  const logs: Array<Record<string, unknown>> = [];
  let buf = '';
  child.stderr!.on('data', (d: Buffer) => {
    buf += d.toString();
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      try {
        logs.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        logs.push({ raw: line });
      }
    }
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => child.once('exit', (code, signal) => r({ code, signal })));
  const p = { child, logs, exited };
  procs.push(p);
  return p;
}

function lines(file: string): string[][] {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').filter(Boolean).map((l) => l.split(' '));
  } catch {
    return [];
  }
}

function starts(file: string): Array<{ token: bigint; id: string; pid: number; path: string }> {
  return lines(file)
    .filter((l) => l[0] === 'start')
    .map((l) => ({ token: BigInt(l[1]!), id: l[2]!, pid: Number(l[3]), path: l[4]! }));
}

const hasLog = (p: Proc, msg: string): boolean => p.logs.some((l) => l.msg === msg);

test('fencepost elect: one leader runs the command with its token; SIGKILL of the leader hands over after session expiry with a greater token', async () => {
  // Invariants: only the elected process starts the command, with FENCING_TOKEN/ELECTION_PATH/ELECTION_ID
  // set; after the leader process dies the standby runs it with a strictly greater token.
  const path = uniquePath('cli-kill');
  const out = join(dir, 'kill.log');
  const common = ['--zk', connect, '--path', path, '--session-timeout-ms', '2000', '--', process.execPath, '-e', CHILD];
  const one = elect(['--id', 'one', ...common.slice(0)], { OUT: out });
  await waitFor(() => starts(out).length === 1, 20_000, 'one starts the command');
  const two = elect(['--id', 'two', ...common], { OUT: out });
  await waitFor(() => hasLog(two, 'connection state'), 20_000, 'two connected (it joins right after)');
  const [first] = starts(out);
  expect(first).toMatchObject({ id: 'one', path });
  pidsToReap.add(first!.pid);
  expect(starts(out)).toHaveLength(1); // the standby does not run the command

  one.child.kill('SIGKILL');
  await waitFor(() => starts(out).length === 2, 20_000, 'two takes over');
  const second = starts(out)[1]!;
  pidsToReap.add(second.pid);
  expect(second.id).toBe('two');
  expect(second.token > first!.token).toBe(true);

  // SIGTERM to fencepost elect: the child is stopped, the process leaves and exits 128+15.
  two.child.kill('SIGTERM');
  const exit = await two.exited;
  expect(exit.code).toBe(143);
  expect(lines(out).at(-1)).toEqual(['stop', second.token.toString()]);
});

test('fencepost elect exits with the command’s own exit code and leaves the election', async () => {
  // Invariant: a command that exits on its own ends the run with its exit code, and the node is gone.
  const path = uniquePath('cli-exit');
  const p = elect(['--zk', connect, '--path', path, '--id', 'x', '--', 'sh', '-c', 'test "$FENCING_TOKEN" = 0 && exit 7']);
  const exit = await p.exited;
  expect(exit.code).toBe(7);
  expect(hasLog(p, 'left the election')).toBe(true);
});

test('fencepost elect on leadership loss: SIGTERM, SIGKILL after the grace period, then reruns with a new token', async () => {
  // Invariants: when the term ends, a child that ignores SIGTERM is killed after --grace-ms, and the
  // command is started again only after the old child is gone, with a strictly greater token.
  const zkPort = Number(connect.split(',')[0]!.split(':')[1]);
  const proxy = await TcpProxy.start({ targetPort: zkPort });
  try {
    const path = uniquePath('cli-revoke');
    const out = join(dir, 'revoke.log');
    const p = elect(['--zk', proxy.address, '--path', path, '--id', 'r', '--session-timeout-ms', '3000', '--grace-ms', '300', '--', process.execPath, '-e', CHILD], {
      OUT: out,
      IGNORE_TERM: '1',
    });
    await waitFor(() => starts(out).length === 1, 20_000, 'first term starts the command');
    const first = starts(out)[0]!;
    pidsToReap.add(first.pid);
    proxy.cut(); // connection drops: with the default policy the term ends at once
    await waitFor(() => starts(out).length === 2, 20_000, 'second term reruns the command');
    const second = starts(out)[1]!;
    pidsToReap.add(second.pid);
    expect(second.token > first.token).toBe(true);
    expect(lines(out).map((l) => l[0])).toEqual(['start', 'ignored-term', 'start']);
    expect(p.logs.some((l) => l.msg === 'grace period over: SIGKILL')).toBe(true);
    expect(() => process.kill(first.pid, 0)).toThrow(); // the first child is gone
    p.child.kill('SIGINT');
    expect((await p.exited).code).toBe(130);
  } finally {
    await proxy.close();
  }
});

test('fencepost elect rejects a missing command and a bad flag with usage errors (exit 2)', async () => {
  const a = elect(['--zk', connect, '--path', '/x']);
  const b = elect(['--zk', connect, '--path', '/x', '--session-timeout-ms', 'soon', '--', 'true']);
  expect((await a.exited).code).toBe(2);
  expect((await b.exited).code).toBe(2);
});

test('fencepost elect --proxy --fence-key: SIGTERM while the proxy is unreachable stops it (exit 143) without starting the command', async () => {
  // Invariant: the fence advance retries while the proxy is down, but never past a stop signal.
  const path = uniquePath('cli-proxy-down');
  const out = join(dir, 'proxy-down.log');
  const p = elect(['--zk', connect, '--path', path, '--id', 'pd', '--proxy', 'http://127.0.0.1:9', '--fence-key', 'k', '--', process.execPath, '-e', CHILD], { OUT: out });
  await waitFor(() => hasLog(p, 'fence advance failed; retrying'), 20_000, 'the advance is being retried');
  p.child.kill('SIGTERM');
  const exit = await Promise.race([p.exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 5000))]);
  expect(exit).not.toBe('hung');
  expect((exit as { code: number | null }).code).toBe(143);
  expect(starts(out)).toEqual([]);
});

test('fencepost elect: --proxy without --fence-key (and the reverse) is a usage error (exit 2), not a resign loop', async () => {
  const a = elect(['--zk', connect, '--path', uniquePath('cli-proxy-usage'), '--proxy', 'http://127.0.0.1:9', '--', 'true']);
  const b = elect(['--zk', connect, '--path', uniquePath('cli-proxy-usage'), '--fence-key', 'k', '--', 'true']);
  const bounded = (q: Proc) => Promise.race([q.exited.then((e) => e.code), new Promise<'hung'>((r) => setTimeout(() => r('hung'), 5000))]);
  expect(await bounded(a)).toBe(2);
  expect(await bounded(b)).toBe(2);
});
