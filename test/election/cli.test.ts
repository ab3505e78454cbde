// `fencepost elect` end to end: real `node bin/fencepost.js elect` processes against real ZooKeeper.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, expect, inject, test } from 'vitest';
import { TcpProxy } from '../../tools/faults/tcp-proxy.ts';
import { ZkSession } from '../../src/election/zk-session.ts';
import { digestId, electionAcl } from '../../src/election/acl.ts';
import { now, openObserver, openTestRoot, processAlive, sleep, uniquePath, waitFor } from '../support/election.ts';

const connect = inject('zkConnect');
const BIN = resolve(import.meta.dirname, '../../bin/fencepost.js');
const dir = mkdtempSync(join(tmpdir(), 'fencepost-elect-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
beforeAll(() => openTestRoot(connect)); // before any election here runs with credentials

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
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.once('exit', (code, signal) => r({ code, signal })),
  );
  const p = { child, logs, exited };
  procs.push(p);
  return p;
}

function lines(file: string): string[][] {
  try {
    return readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .filter(Boolean)
      .map((l) => l.split(' '));
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
    const p = elect(
      [
        '--zk',
        proxy.address,
        '--path',
        path,
        '--id',
        'r',
        '--session-timeout-ms',
        '3000',
        '--grace-ms',
        '300',
        '--',
        process.execPath,
        '-e',
        CHILD,
      ],
      {
        OUT: out,
        IGNORE_TERM: '1',
      },
    );
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
  const p = elect(
    [
      '--zk',
      connect,
      '--path',
      path,
      '--id',
      'pd',
      '--proxy',
      'http://127.0.0.1:9',
      '--fence-key',
      'k',
      '--',
      process.execPath,
      '-e',
      CHILD,
    ],
    { OUT: out },
  );
  await waitFor(() => hasLog(p, 'fence advance failed; retrying'), 20_000, 'the advance is being retried');
  p.child.kill('SIGTERM');
  // Hung: still running 30 s after SIGTERM (it stops within a second; 30 s leaves room for a loaded box).
  const exit = await Promise.race([p.exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 30_000))]);
  expect(exit).not.toBe('hung');
  expect((exit as { code: number | null }).code).toBe(143);
  expect(starts(out)).toEqual([]);
});

test('fencepost elect: --proxy without --fence-key (and the reverse) is a usage error (exit 2), not a resign loop', async () => {
  const a = elect(['--zk', connect, '--path', uniquePath('cli-proxy-usage'), '--proxy', 'http://127.0.0.1:9', '--', 'true']);
  const b = elect(['--zk', connect, '--path', uniquePath('cli-proxy-usage'), '--fence-key', 'k', '--', 'true']);
  // A resign loop never exits; a usage error exits at start-up, which a loaded box may stretch to
  // several seconds (a run under load took more than 5): 30 s tells the two apart.
  const bounded = (q: Proc) =>
    Promise.race([q.exited.then((e) => e.code), new Promise<'hung'>((r) => setTimeout(() => r('hung'), 30_000))]);
  expect(await bounded(a)).toBe(2);
  expect(await bounded(b)).toBe(2);
});

/** Runs `fencepost <args>` to its end. */
function run(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((r) => child.once('exit', (code) => r({ code, stdout, stderr })));
}

async function childCount(observer: ZkSession, path: string): Promise<number> {
  try {
    return (await observer.getChildren(path)).children.length;
  } catch {
    return 0;
  }
}

// Holds on like a command that ignores SIGTERM (so the guardian's SIGKILL is needed as well) and
// never notices that it was orphaned.
const HOLD = `
require('fs').appendFileSync(process.env.OUT, 'hold ' + process.pid + '\\n');
process.on('SIGTERM', () => {});
setInterval(() => {}, 1000);
`;
// The standby's command, at its start: how many processes of the old leader's command still run.
const STANDBY = `
const fs = require('fs'); const out = process.env.OUT;
const alive = (pid) => { try { return !/^\\d+ \\(.*\\) [ZX]/s.test(fs.readFileSync('/proc/' + pid + '/stat', 'utf8')); } catch { return false; } };
const held = fs.readFileSync(out, 'utf8').split('\\n').filter((l) => l.startsWith('hold ')).map((l) => Number(l.split(' ')[1]));
fs.appendFileSync(out, 'standby ' + process.env.FENCING_TOKEN + ' ' + held.filter(alive).length + '\\n');
setInterval(() => {}, 1000);
`;

test("SIGKILL of fencepost elect alone (not its group): its command's whole process group is gone before the standby starts", async () => {
  // Invariant: however elect dies, its command never runs beside the next leader's. The kill hits
  // only the elect process, as the OOM killer would; the command (a shell and two children that
  // ignore SIGTERM) is in a process group of its own, which its guardian kills.
  const path = uniquePath('cli-orphan');
  const out = join(dir, 'orphan.log');
  const held = (): number[] =>
    lines(out)
      .filter((l) => l[0] === 'hold')
      .map((l) => Number(l[1]));
  const a = elect(
    [
      '--id',
      'a',
      '--zk',
      connect,
      '--path',
      path,
      '--session-timeout-ms',
      '2000',
      '--',
      'sh',
      '-c',
      'node -e "$HOLD" & node -e "$HOLD" & wait',
    ],
    { OUT: out, HOLD },
  );
  await waitFor(() => held().length === 2, 20_000, "the leader's command and its children hold on");
  const shellPid = Number(a.logs.find((l) => l.msg === 'elected: started the command')?.childPid);
  for (const pid of [shellPid, ...held()]) pidsToReap.add(pid);
  const b = elect(['--id', 'b', '--zk', connect, '--path', path, '--session-timeout-ms', '2000', '--', process.execPath, '-e', STANDBY], {
    OUT: out,
  });
  const observer = await openObserver(connect);
  try {
    const deadline = now() + 20_000;
    while ((await childCount(observer, path)) < 2) {
      if (now() > deadline) throw new Error('the standby did not join');
      await sleep(20);
    }
  } finally {
    await observer.close();
  }

  const killedAt = now();
  process.kill(a.child.pid!, 'SIGKILL');
  let goneAfterMs: number | null = null;
  const group = [shellPid, ...held()];
  while (goneAfterMs === null && lines(out).every((l) => l[0] !== 'standby')) {
    if (group.every((pid) => !processAlive(pid))) goneAfterMs = now() - killedAt;
    else await sleep(5);
  }
  await waitFor(() => lines(out).some((l) => l[0] === 'standby'), 20_000, 'the standby starts its command');
  const standby = lines(out).find((l) => l[0] === 'standby')!;
  expect(standby[2], 'processes of the old command still running when the standby started').toBe('0');
  expect(goneAfterMs, 'the old command was gone before the standby started').not.toBeNull();
  expect(a.logs.some((l) => String(l.msg).startsWith('fencepost elect is gone without stopping its command'))).toBe(true);
  expect(b.child.exitCode).toBeNull();
  console.info(
    `orphaned command group gone ${goneAfterMs!.toFixed(0)} ms after SIGKILL of fencepost elect (SIGTERM ignored: SIGKILL after the guardian's wait)`,
  );
});

test('fencepost leader prints who leads and with which token, as text or --json; exit 4 before the path exists, 2 on bad usage', async () => {
  // Exit 3 (the path exists, nobody in it): test/cli/elect-failures.test.ts.
  const path = uniquePath('cli-leader');
  const none = await run(['leader', '--zk', connect, '--path', path, '--json']);
  expect(none.code).toBe(4);
  expect(JSON.parse(none.stdout)).toEqual({ electionPath: path, id: null, token: null, pathExists: false });
  const out = join(dir, 'leader.log');
  elect(['--id', 'lead-1', '--zk', connect, '--path', path, '--', process.execPath, '-e', CHILD], { OUT: out });
  await waitFor(() => starts(out).length === 1, 20_000, 'the leader runs its command');
  const { token, pid } = starts(out)[0]!;
  pidsToReap.add(pid);
  const text = await run(['leader', '--zk', connect, '--path', path]);
  expect(text).toMatchObject({ code: 0, stdout: `lead-1 token ${token}\n` });
  const json = await run(['leader', '--zk', connect, '--path', path, '--json']);
  expect(json.code).toBe(0);
  expect(JSON.parse(json.stdout)).toEqual({ electionPath: path, id: 'lead-1', token: token.toString() });
  expect((await run(['leader', '--zk', connect])).code).toBe(2);
  expect((await run(['leader', '--zk', connect, '--path', 'relative'])).code).toBe(2);
});

test('--status-port: /leader is 200 with id and token on the leader only and 503 elsewhere, follows a handover; /healthz is 200 on both', async () => {
  const path = uniquePath('cli-status');
  const out = join(dir, 'status.log');
  const common = ['--zk', connect, '--path', path, '--status-port', '0', '--status-host', '127.0.0.1', '--', process.execPath, '-e', CHILD];
  const statusUrl = (p: Proc): string | null => {
    const port = p.logs.find((l) => l.msg === 'status server listening (/healthz, /leader)')?.port;
    return port === undefined ? null : `http://127.0.0.1:${String(port)}`;
  };
  const get = async (url: string) => {
    const res = await fetch(url);
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  const a = elect(['--id', 's-a', ...common], { OUT: out });
  await waitFor(() => starts(out).length === 1, 20_000, 'a leads');
  const first = starts(out)[0]!;
  pidsToReap.add(first.pid);
  const b = elect(['--id', 's-b', ...common], { OUT: out });
  await waitFor(() => statusUrl(b) !== null && hasLog(b, 'connection state'), 20_000, 'b serves its status');
  const [urlA, urlB] = [statusUrl(a)!, statusUrl(b)!];

  expect(await get(`${urlA}/leader`)).toEqual({
    status: 200,
    body: { leader: true, id: 's-a', electionPath: path, token: first.token.toString() },
  });
  expect(await get(`${urlB}/leader`)).toEqual({ status: 503, body: { leader: false, id: 's-b', electionPath: path } });
  expect(await get(`${urlA}/healthz`)).toMatchObject({ status: 200, body: { status: 'ok', leader: true, zookeeper: 'connected' } });
  expect(await get(`${urlB}/healthz`)).toMatchObject({ status: 200, body: { status: 'ok', leader: false, zookeeper: 'connected' } });
  expect((await fetch(`${urlA}/nothing`)).status).toBe(404);

  a.child.kill('SIGTERM');
  expect((await a.exited).code).toBe(143);
  await waitFor(() => starts(out).length === 2, 20_000, 'b takes over');
  const second = starts(out)[1]!;
  pidsToReap.add(second.pid);
  expect(await get(`${urlB}/leader`)).toEqual({
    status: 200,
    body: { leader: true, id: 's-b', electionPath: path, token: second.token.toString() },
  });
});

test('ZK_AUTH (or --zk-auth): fencepost elect creates its election nodes with the election ACL, keeps the credentials from its command; a malformed value is a usage error (exit 2)', async () => {
  const path = uniquePath('cli-auth');
  const out = join(dir, 'auth.log');
  const auth = { user: 'elector', password: 'cli-secret' };
  const command = ['sh', '-c', 'echo "zk_auth ${ZK_AUTH-unset}" >> "$OUT"; exec "$0" -e "$CHILD"', process.execPath];
  elect(['--id', 'au', '--zk', connect, '--path', path, '--', ...command], { OUT: out, CHILD, ZK_AUTH: `${auth.user}:${auth.password}` });
  await waitFor(() => starts(out).length === 1, 20_000, 'the leader runs its command');
  pidsToReap.add(starts(out)[0]!.pid);
  expect(lines(out)[0]).toEqual(['zk_auth', 'unset']);
  const owner = await ZkSession.open({ connect, sessionTimeoutMs: 4000, auth });
  try {
    const { children } = await owner.getChildren(path);
    expect(children).toHaveLength(1);
    for (const p of [path, `${path}/${children[0]}`]) expect((await owner.getAcl(p)).acl, p).toEqual(electionAcl(digestId(auth)));
  } finally {
    await owner.close();
  }
  const bad = elect(['--zk', connect, '--path', uniquePath('cli-auth-bad'), '--zk-auth', 'no-password', '--', 'true']);
  expect((await bad.exited).code).toBe(2);
  const badEnv = elect(['--zk', connect, '--path', uniquePath('cli-auth-bad'), '--', 'true'], { ZK_AUTH: ':pw' });
  expect((await badEnv.exited).code).toBe(2);
});
