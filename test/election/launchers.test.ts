// Every documented way of running `fencepost elect` hands over on SIGTERM: elect must get the
// signal, stop its command and close its session (its node goes at once), instead of leaving the
// next leader to wait out the session timeout. The package is `npm pack`ed and installed into an
// empty project, as users get it; then SIGTERM goes to what a supervisor would signal: the
// installed bin's process, or npx's (npm), which runs elect under `sh -c`.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, expect, inject, test } from 'vitest';
import { Election } from '../../src/election/election.ts';
import { processAlive, uniquePath, waitFor } from '../support/election.ts';
import { REPO } from '../support/proxy.ts';

const connect = inject('zkConnect');
let project: string;
const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

beforeAll(() => {
  project = mkdtempSync(join(tmpdir(), 'fencepost-launch-'));
  // dist/ is fresh: the run's global setup built it.
  const out = execFileSync('npm', ['pack', '--pack-destination', project, '--ignore-scripts', '--silent'], { cwd: REPO, encoding: 'utf8' });
  const tarball = out.trim().split('\n').at(-1)!;
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
  execFileSync('npm', ['install', `./${tarball}`, '--prefer-offline', '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error'], {
    cwd: project,
    stdio: 'pipe',
  });
}, 180_000);
afterAll(() => rmSync(project, { recursive: true, force: true, maxRetries: 3 }));

// The command: records its start and the SIGTERM that stops it.
const CHILD = `
const fs = require('fs');
fs.appendFileSync(process.env.OUT, 'start ' + process.env.FENCING_TOKEN + '\\n');
process.on('SIGTERM', () => { fs.appendFileSync(process.env.OUT, 'stop ' + process.env.FENCING_TOKEN + '\\n'); process.exit(0); });
setInterval(() => {}, 1000);
`;

/** The environment without npm's variables (vitest may itself run under npm). */
function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  return { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('npm_'))), ...extra };
}

interface Launched {
  child: ChildProcess;
  logs: Array<Record<string, unknown>>;
  exited: Promise<number | null>;
}

function launch(command: string, args: string[], env: NodeJS.ProcessEnv): Launched {
  const child = spawn(command, args, { cwd: project, env, stdio: ['ignore', 'ignore', 'pipe'] });
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
  return { child, logs, exited };
}

/**
 * Starts elect through `how`, lets it lead, adds a standby, sends SIGTERM to the launched process
 * and checks the handover: the command stopped by elect, elect left the election (closed its
 * session) and exited, and the standby elected. The session timeout is 20 s: a handover by expiry
 * instead would show no "left the election" and a live elect.
 */
async function sigtermHandsOver(how: (electArgs: string[], out: string) => Launched): Promise<Launched> {
  const path = uniquePath('launch');
  const out = join(project, `${path.split('/').at(-1)}.log`);
  const read = (): string[] => {
    try {
      return readFileSync(out, 'utf8').trim().split('\n').filter(Boolean);
    } catch {
      return [];
    }
  };
  const a = how(
    ['elect', '--zk', connect, '--path', path, '--id', 'a', '--session-timeout-ms', '20000', '--', process.execPath, '-e', CHILD],
    out,
  );
  cleanups.push(() => {
    if (a.child.exitCode === null && a.child.signalCode === null) a.child.kill('SIGKILL');
    const pid = electPid(a);
    if (pid !== null && processAlive(pid)) process.kill(pid, 'SIGKILL');
  });
  await waitFor(() => read().length === 1, 30_000, 'elect leads and starts its command');
  const standby = new Election({ connect, path, id: 'standby', sessionTimeoutMs: 4000 });
  cleanups.push(() => standby.close());
  await standby.start();
  const elected = new Promise<bigint>((resolve) => standby.once('elected', ({ token }) => resolve(token)));

  a.child.kill('SIGTERM');
  await waitFor(() => a.logs.some((l) => l.msg === 'left the election'), 15_000, 'elect stopped and left the election');
  const token = await elected;
  const pid = electPid(a)!;
  await waitFor(() => !processAlive(pid), 10_000, 'elect exited');
  const old = BigInt(read()[0]!.split(' ')[1]!);
  expect(read()).toEqual([`start ${old}`, `stop ${old}`]); // elect stopped its command
  expect(token > old).toBe(true);
  return a;
}

function electPid(a: Launched): number | null {
  const pid = a.logs.find((l) => l.msg === 'elected: started the command')?.pid;
  return typeof pid === 'number' ? pid : null;
}

test('the installed bin: SIGTERM stops the command and hands over at once (exit 143)', async () => {
  const a = await sigtermHandsOver((args, out) => launch(join(project, 'node_modules', '.bin', 'fencepost'), args, cleanEnv({ OUT: out })));
  expect(await a.exited).toBe(143);
});

test('npx fencepost elect: SIGTERM to npx reaches elect, which stops the command and hands over at once', async () => {
  // npm forwards SIGTERM to the `sh -c` it runs elect under; the shell dies of it without passing it
  // on, and elect, orphaned, stops as it would on SIGTERM.
  const a = await sigtermHandsOver((args, out) => launch('npx', ['--no', 'fencepost', ...args], cleanEnv({ OUT: out })));
  expect(
    a.logs.some((l) => l.msg === 'the process that started fencepost elect (npm) is gone: stopping as on SIGTERM' || l.msg === 'stopping'),
  ).toBe(true);
});

test('the image: the entrypoint is exec form with tini as PID 1 in front of node bin/fencepost.js (no shell to swallow SIGTERM)', () => {
  // Docker is not available here; the Dockerfile's last stage is what `docker run fencepost elect …` runs.
  const dockerfile = readFileSync(join(REPO, 'Dockerfile'), 'utf8');
  const lastStage = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '));
  const entrypoint = /^ENTRYPOINT\s+(.*)$/m.exec(lastStage)?.[1];
  expect(entrypoint, 'ENTRYPOINT of the last stage').toBeDefined();
  expect(JSON.parse(entrypoint!)).toEqual(['/usr/bin/tini', '--', 'node', 'bin/fencepost.js']);
  expect(lastStage).toMatch(/apt-get install[^\n]*\btini\b/);
});
