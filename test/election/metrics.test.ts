// GET /metrics on `fencepost elect --status-port`: real `node bin/fencepost.js elect` processes
// against real ZooKeeper, scraped before and after a handover, and the text checked by
// `promtool check metrics` (Debian's `prometheus` package; scripts/setup.sh --test installs it).
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { afterEach, expect, inject, test } from 'vitest';
import { uniquePath, waitFor } from '../support/election.ts';
import { closedPort } from '../../tools/ports.ts';

const connect = inject('zkConnect');
const BIN = resolve(import.meta.dirname, '../../bin/fencepost.js');
// The command under election: runs until stopped, exits when orphaned.
const CHILD =
  'const p = process.ppid; process.on("SIGTERM", () => process.exit(0)); setInterval(() => { if (process.ppid !== p) process.exit(0); }, 100);';

interface Proc {
  child: ChildProcess;
  logs: Array<Record<string, unknown>>;
  exited: Promise<number | null>;
}
const procs: Proc[] = [];
afterEach(() => {
  for (const p of procs.splice(0)) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
});

function elect(args: string[]): Proc {
  const child = spawn(process.execPath, [BIN, 'elect', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
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
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const p = { child, logs, exited };
  procs.push(p);
  return p;
}

const statusUrl = (p: Proc): string | null => {
  const port = p.logs.find((l) => l.msg === 'status server listening (/healthz, /leader)')?.port;
  return port === undefined ? null : `http://127.0.0.1:${String(port)}`;
};
const hasLog = (p: Proc, msg: string): boolean => p.logs.some((l) => l.msg === msg);

async function scrape(url: string): Promise<string> {
  const res = await fetch(`${url}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return await res.text();
}

/** The value of one series, by its exact label set as exposed (prom-client keeps label order), or null. */
function value(text: string, name: string, labels: string): number | null {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? null : Number(line.slice(line.lastIndexOf(' ') + 1));
}

function promtoolCheck(text: string): void {
  const run = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 60_000 });
  expect(run.error, 'promtool is not installed: run scripts/setup.sh --test (apt-get install prometheus)').toBeUndefined();
  expect(run.status, `${run.stdout}${run.stderr}`).toBe(0);
}

test('/metrics: is_leader, token, changes, session state and seconds since change follow a handover, and promtool check metrics passes', async () => {
  const path = uniquePath('metrics');
  const common = ['--zk', connect, '--path', path, '--status-port', '0', '--status-host', '127.0.0.1', '--', process.execPath, '-e', CHILD];
  const a = elect(['--id', 'm-a', ...common]);
  await waitFor(() => hasLog(a, 'elected: started the command'), 20_000, 'a leads');
  const b = elect(['--id', 'm-b', ...common]);
  await waitFor(() => statusUrl(b) !== null && hasLog(b, 'connection state'), 20_000, 'b serves its status');
  const [urlA, urlB] = [statusUrl(a)!, statusUrl(b)!];
  const la = `election_path="${path}",candidate="m-a"`;
  const lb = `election_path="${path}",candidate="m-b"`;
  const tokenA = BigInt(((await (await fetch(`${urlA}/leader`)).json()) as { token: string }).token);

  const before = { a: await scrape(urlA), b: await scrape(urlB) };
  expect(value(before.a, 'fencepost_election_is_leader', la)).toBe(1);
  expect(value(before.b, 'fencepost_election_is_leader', lb)).toBe(0);
  expect(value(before.a, 'fencepost_election_token', la)).toBe(Number(tokenA));
  expect(value(before.b, 'fencepost_election_token', lb)).toBeNull(); // only while leading
  expect(value(before.a, 'fencepost_election_leadership_changes_total', la)).toBe(1);
  expect(value(before.b, 'fencepost_election_leadership_changes_total', lb)).toBe(0); // exposed at 0 from the start
  for (const [text, l] of [
    [before.a, la],
    [before.b, lb],
  ] as const) {
    expect(value(text, 'fencepost_election_session_state', `${l},state="connected"`)).toBe(1);
    for (const state of ['connecting', 'suspended', 'lost', 'closed'])
      expect(value(text, 'fencepost_election_session_state', `${l},state="${state}"`)).toBe(0);
  }
  // No --proxy: no fence advance, no series for it.
  expect(before.a).not.toContain('fencepost_election_fence_advance_failures_total');
  expect(before.a).toContain('nodejs_eventloop_lag_p99_seconds');
  promtoolCheck(before.a);
  promtoolCheck(before.b);

  await new Promise((r) => setTimeout(r, 1100));
  const sinceB = value(await scrape(urlB), 'fencepost_election_seconds_since_change', lb)!;
  expect(sinceB).toBeGreaterThanOrEqual(1); // since b started, never elected

  a.child.kill('SIGTERM');
  expect(await a.exited).toBe(143);
  await waitFor(() => hasLog(b, 'elected: started the command'), 20_000, 'b takes over');
  const after = await scrape(urlB);
  const tokenB = BigInt(((await (await fetch(`${urlB}/leader`)).json()) as { token: string }).token);
  expect(tokenB > tokenA).toBe(true);
  expect(value(after, 'fencepost_election_is_leader', lb)).toBe(1);
  expect(value(after, 'fencepost_election_token', lb)).toBe(Number(tokenB));
  expect(value(after, 'fencepost_election_leadership_changes_total', lb)).toBe(1);
  expect(value(after, 'fencepost_election_seconds_since_change', lb)).toBeLessThan(sinceB); // reset by the election
  promtoolCheck(after);
});

test('/metrics with --proxy: fence advance failures count up while the candidate leads', async () => {
  // A port nothing listens on: every advance fails at once (ECONNREFUSED), 5 times ~1 s apart, then elect exits 1.
  const port = await closedPort();
  const path = uniquePath('metrics-proxy');
  const p = elect([
    '--zk',
    connect,
    '--path',
    path,
    '--id',
    'm-p',
    '--status-port',
    '0',
    '--status-host',
    '127.0.0.1',
    '--proxy',
    `http://127.0.0.1:${port}`,
    '--fence-key',
    'k',
    '--',
    process.execPath,
    '-e',
    CHILD,
  ]);
  await waitFor(() => p.logs.filter((l) => l.msg === 'fence advance failed; retrying').length >= 2, 20_000, 'two failed advances');
  const text = await scrape(statusUrl(p)!);
  const l = `election_path="${path}",candidate="m-p"`;
  expect(value(text, 'fencepost_election_is_leader', l)).toBe(1);
  expect(value(text, 'fencepost_election_fence_advance_failures_total', l)).toBeGreaterThanOrEqual(2);
  promtoolCheck(text);
  expect(await p.exited).toBe(1);
});
