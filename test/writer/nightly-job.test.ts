// The lesson's worked example 1 with real processes: 3 replicas run `fencepost elect --proxy
// --fence-key -- node nightly-job.mjs`; the job records each scheduled run through the proxy. The
// leader (elect and its job) is SIGKILLed mid-run. Invariants: at no moment do two replicas have a
// run open; each scheduled run completes at most once, by one replica; runs after the crash are by
// a new leader with a higher token; the proxy's records agree with the job logs.
import { afterAll, beforeAll, expect, inject, test } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { BIN, REPO, listen, testApp } from '../support/proxy.ts';
import { uniquePath, waitFor } from '../support/election.ts';

interface JobEvent {
  t: number;
  replica: string;
  token: string;
  pid: number;
  event: 'job-start' | 'run-start' | 'run-done' | 'rejected' | 'job-stop';
  slot?: number;
}

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
let dir: string;

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  url = await listen(app);
  dir = mkdtempSync(join(tmpdir(), 'fencepost-nightly-'));
});
afterAll(async () => {
  await app.close();
  await db.drop();
  rmSync(dir, { recursive: true, force: true });
});

test('three replicas run a scheduled job: never two at once, the crashed leader is replaced by a higher token', async () => {
  const logFile = join(dir, 'jobs.log');
  const path = uniquePath('nightly');
  const fenceKey = `nightly-${path}`;
  const read = (): JobEvent[] =>
    existsSync(logFile)
      ? readFileSync(logFile, 'utf8')
          .trim()
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l) as JobEvent)
      : [];
  const replicas = new Map<string, ChildProcess>();
  for (const id of ['r1', 'r2', 'r3']) {
    const child = spawn(
      process.execPath,
      [
        BIN,
        'elect',
        '--zk',
        inject('zkConnect'),
        '--path',
        path,
        '--id',
        id,
        '--session-timeout-ms',
        '2000',
        '--grace-ms',
        '1000',
        '--proxy',
        url,
        '--fence-key',
        fenceKey,
        '--',
        process.execPath,
        join(REPO, 'test/fixtures/nightly-job.mjs'),
      ],
      { env: { ...process.env, JOB_LOG: logFile, JOB_PERIOD_MS: '400', JOB_WORK_MS: '150' }, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    child.stderr?.resume();
    replicas.set(id, child);
  }
  try {
    await waitFor(() => read().filter((e) => e.event === 'run-done').length >= 3, 30_000, 'three runs done');
    // Kill the leader mid-run: wait for a run to start, then SIGKILL both the job and its elect.
    const before = read().length;
    await waitFor(
      () =>
        read()
          .slice(before)
          .some((e) => e.event === 'run-start'),
      10_000,
      'a run to start',
    );
    const open = read()
      .slice(before)
      .find((e) => e.event === 'run-start')!;
    process.kill(open.pid, 'SIGKILL');
    replicas.get(open.replica)!.kill('SIGKILL');
    const killedAt = Date.now();
    await waitFor(() => read().filter((e) => e.event === 'run-done' && e.t > killedAt).length >= 3, 30_000, 'three runs by the new leader');
  } finally {
    for (const c of replicas.values()) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    await Promise.all(
      [...replicas.values()].map((c) => (c.exitCode !== null || c.signalCode !== null ? null : new Promise((r) => c.once('exit', r)))),
    );
  }

  const events = read();
  const killed = events.find(
    (e) => e.event === 'run-start' && !events.some((d) => d.event === 'run-done' && d.pid === e.pid && d.slot === e.slot),
  );
  expect(killed, 'the killed run never completed').toBeDefined();
  const killedAt = Math.max(...events.filter((e) => e.pid === killed!.pid).map((e) => e.t));

  // Runs as intervals; the killed one ends at its last sign of life.
  const runs = events
    .filter((e) => e.event === 'run-start')
    .map((s) => ({ ...s, end: events.find((d) => d.event === 'run-done' && d.pid === s.pid && d.slot === s.slot)?.t ?? killedAt }))
    .sort((a, b) => a.t - b.t);
  for (let i = 1; i < runs.length; i++) {
    const prev = runs[i - 1]!;
    const cur = runs[i]!;
    if (cur.replica !== prev.replica)
      expect(cur.t, `run of ${cur.replica} began before ${prev.replica}'s ended`).toBeGreaterThanOrEqual(prev.end);
  }
  // Each scheduled run completes at most once, by one replica, and the proxy holds that replica's record.
  const done = events.filter((e) => e.event === 'run-done');
  const slots = new Set(done.map((e) => e.slot));
  expect(slots.size).toBe(done.length);
  for (const d of done) {
    const res = await fetch(`${url}/v1/objects/${encodeURIComponent(`nightly/run-${d.slot}`)}`);
    expect(await res.json()).toMatchObject({ state: 'done', replica: d.replica, token: d.token });
  }
  // After the crash: only other replicas, all with tokens above the crashed leader's.
  const after = runs.filter((r) => r.t > killedAt);
  expect(after.length).toBeGreaterThanOrEqual(3);
  for (const r of after) {
    expect(r.replica).not.toBe(killed!.replica);
    expect(BigInt(r.token) > BigInt(killed!.token)).toBe(true);
  }
  // Nothing was rejected: the dead leader never came back, and each new leader advanced the fence first.
  expect(events.filter((e) => e.event === 'rejected')).toEqual([]);
}, 90_000);
