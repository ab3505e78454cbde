// The forced-pause demo, end to end with real processes, ZooKeeper and Postgres (shortened timings).
// It is also the lesson's GC-pause example as a test: leader A writes X with token t; A is frozen
// (SIGSTOP) past the session timeout; B is elected with a token > t and writes X; A resumes and its
// write to X gets 409; X holds B's value; A has stepped down.
import { afterAll, expect, inject, test, vi } from 'vitest';
import { TOKEN_MEANS, runDemo } from '../../src/demo/demo.ts';
import { freePort } from '../../src/ports.ts';
import { clientRoleFor, createTestDatabase } from '../support/db.ts';

// A database of the file's own: the demos' GRANTs on one shared database, run side by side, fail
// with "tuple concurrently updated".
const db = await createTestDatabase({ migrate: false });
afterAll(() => db.drop());

test('the forced-pause demo runs green: the zombie is rejected with 409 and steps down, no stale write accepted', async () => {
  const lines: string[] = [];
  // Its proxy's ports come from FENCEPOST_PORT_RANGE when set.
  const lo = Math.min(await freePort(), 65_535 - 199);
  vi.stubEnv('FENCEPOST_PORT_RANGE', `${lo}-${lo + 199}`);
  const result = await runDemo({
    replicas: 3,
    sessionTimeoutMs: 2000,
    pauseMs: 3500,
    intervalMs: 150,
    databaseUrl: db.url,
    zkConnect: inject('zkConnect'),
    // Its own client login (roles are cluster-wide), dropped with the database.
    clientRole: clientRoleFor(db.url),
    print: (l) => lines.push(l),
  }).finally(() => vi.unstubAllEnvs());
  expect(result.failures).toEqual([]);
  expect(result.ok).toBe(true);
  const { zombie, successor } = result;
  expect(zombie).not.toBeNull();
  expect(successor).not.toBeNull();
  expect(successor!.replica).not.toBe(zombie!.replica);
  expect(BigInt(successor!.token) > BigInt(zombie!.token)).toBe(true);
  // A wrote with t before the pause; its post-pause write with t was rejected; it stepped down.
  const mine = result.events.filter((e) => e.replica === zombie!.replica);
  expect(mine.some((e) => e.event === 'write-accepted' && e.token === zombie!.token)).toBe(true);
  const rejected = mine.find((e) => e.event === 'write-rejected' && e.token === zombie!.token);
  expect(rejected?.highestToken).toBeDefined();
  expect(BigInt(rejected!.highestToken!) > BigInt(zombie!.token)).toBe(true);
  expect(mine.some((e) => e.event === 'stepped-down' && e.t >= rejected!.t)).toBe(true);
  // X holds a newer leader's value: the last accepted write is not the zombie's.
  const last = result.events
    .filter((e) => e.event === 'write-accepted')
    .sort((a, b) => a.version! - b.version!)
    .at(-1)!;
  expect(last.replica).not.toBe(zombie!.replica);
  expect(BigInt(last.token!) > BigInt(zombie!.token)).toBe(true);
  // The printed timeline tells the story.
  const text = lines.join('\n');
  expect(text).toContain(`SIGSTOP ${zombie!.replica}`);
  expect(text).toContain('write REJECTED (409)');
  expect(text).toContain('no stale write accepted');
  // For the novice: what a token is, in one line before the timeline; the summary names each replica's door.
  expect(lines.findIndex((l) => l.includes(TOKEN_MEANS))).toBeLessThan(lines.findIndex((l) => l.includes('elected')));
  expect(lines).toContain('replica      door   accepted  rejected  terms (tokens)');
  expect(lines.some((l) => /^replica-1 +SQL +\d+ +\d+ /.test(l))).toBe(true);
  expect(lines.some((l) => /^replica-2 +HTTP +\d+ +\d+ /.test(l))).toBe(true);
  const port = Number(/proxy up at http:\/\/127\.0\.0\.1:(\d+)/.exec(text)?.[1]);
  expect(port >= lo && port <= lo + 199, `proxy port ${port} in ${lo}-${lo + 199}`).toBe(true);
  const sqlPort = Number(/SQL endpoint :(\d+)/.exec(text)?.[1]);
  expect(sqlPort >= lo && sqlPort <= lo + 199, `SQL endpoint port ${sqlPort} in ${lo}-${lo + 199}`).toBe(true);
}, 120_000);
