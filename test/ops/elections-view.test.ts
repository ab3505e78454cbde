// GET /v1/elections and the dashboard's Elections panel, against a real ZooKeeper and real
// elections: who leads each mapped election, since when, how many queue, and whether the leader's
// fence is at its token yet (a leader whose advance keeps failing shows as not raised).
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import type { Browser } from 'playwright-core';
import { Election } from '../../src/election/election.ts';
import { ZkSession } from '../../src/election/zk-session.ts';
import type { DigestAuth } from '../../src/election/acl.ts';
import { buildApp } from '../../src/proxy/http/app.ts';
import { ELECTIONS_CACHE_MS } from '../../src/proxy/http/routes/elections.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { closedPort } from '../../tools/ports.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { listen, testApp } from '../support/proxy.ts';
import { launchChromium } from '../../tools/chromium.ts';

const AUTH: DigestAuth = { user: 'elector', password: `pw-${randomUUID()}` };
const root = `/fencepost-test/view-${randomUUID().slice(0, 8)}`;
const jobs = `${root}/nightly`;
const idle = `${root}/idle`;

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
let browser: Browser;
const elections: Election[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  app = buildApp({
    store: new FenceStore(db.pool, STORE_DEFAULTS),
    bodyLimitBytes: 1024,
    forgeryGuard: {
      zkConnect: inject('zkConnect'),
      electionAuth: AUTH,
      mappings: [
        { prefix: 'nightly/', electionPath: jobs },
        { prefix: 'idle/', electionPath: idle },
      ],
    },
  });
  url = await listen(app);
  // The common parent stays open: elections with credentials give the parents they create their ACL.
  const s = await ZkSession.open({ connect: inject('zkConnect'), sessionTimeoutMs: 4000 });
  await s.mkdirp('/fencepost-test');
  await s.close();
  browser = await launchChromium();
});
afterAll(async () => {
  await Promise.all(elections.map((e) => e.close()));
  await browser?.close();
  await app?.close();
  await db?.drop();
});

async function candidate(id: string): Promise<Election> {
  const e = new Election({ connect: inject('zkConnect'), path: jobs, id, sessionTimeoutMs: 4000, auth: AUTH });
  elections.push(e);
  await e.start();
  return e;
}

interface View {
  guard: boolean;
  elections: Array<{
    electionPath: string;
    fenceKeyPrefix: string;
    candidates: number;
    leader: { token: string; id: string | null; joinedAt: string; seenSince: string } | null;
    untrusted: string | null;
    fence: { fenceKey: string; highestToken: string; raisedBy: string | null } | null;
    fenceRaised: boolean | null;
  }>;
}
const view = async (): Promise<View> => {
  const res = await fetch(`${url}/v1/elections`);
  expect(res.status, await res.clone().text()).toBe(200);
  return (await res.json()) as View;
};
const electionAt = async (path: string) => (await view()).elections.find((e) => e.electionPath === path)!;
const raise = (token: bigint, writerId: string) =>
  fetch(`${url}/v1/objects/nightly%2Freport`, {
    method: 'PUT',
    headers: { 'fencing-token': token.toString(), 'fence-key': 'nightly/report', 'writer-id': writerId },
    body: 'r',
  });

describe('GET /v1/elections', () => {
  test("follows a real election: the leader's token, the queue, and whether its fence is raised, through a handover", async () => {
    // Invariant: the leader shown is the lowest live candidate, and fenceRaised is true exactly when
    // the fence under the prefix is at that leader's token.
    expect(await electionAt(jobs)).toMatchObject({
      fenceKeyPrefix: 'nightly/',
      candidates: 0,
      leader: null,
      fenceRaised: null,
      fence: null,
    });

    const a = await candidate('replica-a');
    const tokenA = await a.waitForLeadership();
    const b = await candidate('replica-b');
    // One reading answers for up to ELECTIONS_CACHE_MS: what changed shows within it.
    await expect
      .poll(() => electionAt(jobs))
      .toMatchObject({
        candidates: 2,
        leader: { token: tokenA.toString(), id: 'replica-a' },
        fenceRaised: false,
        fence: null,
        untrusted: null,
      });
    const before = await electionAt(jobs);
    expect(Date.parse(before.leader!.joinedAt)).toBeGreaterThan(Date.now() - 60_000);
    // clocks: ZooKeeper's and ours
    expect(Date.parse(before.leader!.seenSince)).toBeGreaterThanOrEqual(Date.parse(before.leader!.joinedAt) - 5_000);

    expect((await raise(tokenA, 'replica-a')).status).toBe(200);
    await expect
      .poll(() => electionAt(jobs))
      .toMatchObject({
        leader: { token: tokenA.toString() },
        fenceRaised: true,
        fence: { fenceKey: 'nightly/report', highestToken: tokenA.toString(), raisedBy: 'replica-a' },
      });

    // The leader goes; the next in line leads, and its fence is behind until it writes.
    await a.close();
    const tokenB = await b.waitForLeadership();
    expect(tokenB).toBeGreaterThan(tokenA);
    await expect
      .poll(() => electionAt(jobs))
      .toMatchObject({
        leader: { token: tokenB.toString() },
        candidates: 1,
        fenceRaised: false,
        fence: { highestToken: tokenA.toString() },
      });
    expect((await raise(tokenB, 'replica-b')).status).toBe(200);
    await expect
      .poll(() => electionAt(jobs))
      .toMatchObject({ fenceRaised: true, fence: { highestToken: tokenB.toString(), raisedBy: 'replica-b' } });
    await b.close();
  });

  test('a burst of requests costs one reading: 50 concurrent GETs ask ZooKeeper for each path once', async () => {
    // Invariant: the work per request is bounded; a reader cannot make the proxy hammer ZooKeeper.
    await new Promise((r) => setTimeout(r, ELECTIONS_CACHE_MS)); // past the last reading
    const reads = app.forgeryGuard!.zkReads;
    const started = Date.now();
    const answers = await Promise.all(Array.from({ length: 50 }, () => view()));
    const elapsed = Date.now() - started;
    expect(new Set(answers.map((a) => JSON.stringify(a))).size).toBe(1);
    // Readings start at least ELECTIONS_CACHE_MS apart, each asks once per mapped path (2). A quiet
    // box answers the burst inside one period (2 reads); a loaded one may straddle a few, never 50.
    const periods = 1 + Math.floor(elapsed / ELECTIONS_CACHE_MS);
    expect(app.forgeryGuard!.zkReads - reads).toBeLessThanOrEqual(2 * periods);
    expect(periods).toBeLessThan(25); // else the bound above says nothing about the burst
  });

  test('without the forgery guard no election path is known: an empty list that says why', async () => {
    const plain = testApp(db.pool);
    try {
      const res = await plain.inject({ url: '/v1/elections' });
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual({ guard: false, elections: [] });
    } finally {
      await plain.close();
    }
  });

  test('ZooKeeper unreachable: 503 unavailable, not a list that says nobody leads', async () => {
    const dead = buildApp({
      store: new FenceStore(db.pool, STORE_DEFAULTS),
      bodyLimitBytes: 1024,
      forgeryGuard: {
        zkConnect: `127.0.0.1:${await closedPort()}`,
        electionAuth: AUTH,
        connectTimeoutMs: 500,
        mappings: [{ prefix: 'x/', electionPath: '/x' }],
      },
    });
    try {
      const res = await dead.inject({ url: '/v1/elections' });
      expect(res.statusCode).toBe(503);
      expect(res.json().error).toBe('unavailable');
    } finally {
      await dead.close();
    }
  });
});

describe("the dashboard's Elections panel, in headless Chromium", () => {
  test('shows the leader and its fence, flags a leader that does not raise it, follows a handover, and says when nobody leads', async () => {
    const c = await candidate('replica-c');
    const tokenC = await c.waitForLeadership();
    const d = await candidate('replica-d');
    expect((await raise(tokenC, 'replica-c')).status).toBe(200);
    const page = await browser.newPage();
    const problems: string[] = [];
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    try {
      await page.goto(`${url}/dashboard?refreshMs=300&raiseGraceMs=1000`);
      const row = (path: string) => page.locator(`#elections tbody tr[data-election-path="${path}"]`);
      await expect.poll(() => row(jobs).locator('.leader-token').textContent(), { timeout: 10_000 }).toBe(tokenC.toString());
      expect(await row(jobs).locator('.leader-id').textContent()).toBe('replica-c'); // the leader by name, beside its token
      expect(await row(jobs).locator('.fence-state').getAttribute('data-state')).toBe('raised');
      expect(await row(jobs).locator('.candidates').textContent()).toBe('2');
      expect(await row(idle).locator('.fence-state').textContent()).toBe('nobody leads');
      expect(await row(idle).locator('.leader-id').textContent()).toBe('—');

      await c.close();
      const tokenD = await d.waitForLeadership();
      await expect.poll(() => row(jobs).locator('.leader-token').textContent(), { timeout: 10_000 }).toBe(tokenD.toString());
      expect(await row(jobs).locator('.leader-id').textContent()).toBe('replica-d');
      expect(await row(jobs).locator('.fence-state').getAttribute('data-state')).toBe('behind');
      // A leader that does not raise its fence past the grace is flagged: it leads but cannot write.
      await expect.poll(() => row(jobs).locator('.fence-state').textContent(), { timeout: 10_000 }).toMatch(/^not raised for ≥ \d+ s$/);
      expect(await row(jobs).locator('.fence-state').getAttribute('class')).toContain('bad');
      expect((await raise(tokenD, 'replica-d')).status).toBe(200);
      await expect.poll(() => row(jobs).locator('.fence-state').getAttribute('data-state'), { timeout: 10_000 }).toBe('raised');
      expect(await row(jobs).locator('.fence-token').textContent()).toBe(tokenD.toString());
      // The fence's holder, and since when, in the Fences table too.
      const fence = page.locator('#fences tbody tr[data-fence-key="nightly/report"]');
      await expect.poll(() => fence.locator('.raised-by').textContent(), { timeout: 10_000 }).toBe('replica-d');
      expect(await fence.locator('.raised-at').textContent()).toMatch(/^\d+ s ago$/);
      expect(problems).toEqual([]);
    } finally {
      await page.close();
      await d.close();
    }
  });
});
