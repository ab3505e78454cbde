// Objects under a protected prefix (`fencepost protect --prefix`) are checked against the prefix's
// fence over HTTP, whatever Fence-Key says or leaves out: the proxy resolves the fence key from
// its copy of the prefixes, and Postgres's trigger refuses a misfenced object when that copy is
// stale. Invariant of every refusal: the object (read in Postgres) is as it was, and no fence was
// made or raised by the refused request.
import { describe, expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { dbTest } from '../../support/fixtures.ts';
import { testApp } from '../../support/proxy.ts';
import { deleteObject, putObject, storedObject } from '../../support/objects.ts';
import { recordingStatements } from '../../support/statements.ts';
import type { TestDatabase } from '../../support/db.ts';
import { protectPrefix } from '../../../src/fence/protect.ts';
import { buildApp } from '../../../src/proxy/http/app.ts';
import { FenceStore } from '../../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../../src/proxy/config.ts';
import { parseKeys } from '../../../src/proxy/access/keys.ts';

/** Longer than the file: the app's copy of the prefixes changes only at start and after a refusal by Postgres. */
const NEVER_MS = 3_600_000;

/** The file's database with `jobs/` protected by `jobs`, and an app that read it at start. */
const test = dbTest.extend('app', { scope: 'file' }, async ({ db }, { onCleanup }): Promise<FastifyInstance> => {
  await protectPrefix(db.pool, 'jobs/', 'jobs');
  const app = testApp(db.pool, { protectedPrefixRefreshMs: NEVER_MS });
  onCleanup(() => app.close());
  await app.ready();
  return app;
});

async function highest(db: TestDatabase, fenceKey: string): Promise<string | null> {
  const { rows } = await db.pool.query<{ t: string }>('SELECT highest_token::text AS t FROM fencepost.fences WHERE fence_key = $1', [
    fenceKey,
  ]);
  return rows[0]?.t ?? null;
}

describe('the zombie scenario: one leader, many objects under jobs/, one fence key jobs', () => {
  test('the leader writes jobs/1 with Fence-Key jobs at token 6', async ({ app, db }) => {
    const res = await putObject(app, 'jobs/1', 6, 'leader', 'jobs');
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ key: 'jobs/1', fenceKey: 'jobs', token: '6', version: 1 });
    expect(await storedObject(db, 'jobs/1')).toMatchObject({ fence_key: 'jobs', token: '6', body: 'leader' });
  });

  test('a zombie at token 5 without Fence-Key is checked against fence jobs: 409 stale_token, jobs/1 unchanged, no fence of its own', async ({
    app,
    db,
  }) => {
    const res = await putObject(app, 'jobs/1', 5, 'zombie');
    expect(res.statusCode, res.body).toBe(409);
    expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: 'jobs', token: '5', highestToken: '6' });
    expect(await storedObject(db, 'jobs/1')).toMatchObject({ fence_key: 'jobs', token: '6', version: '1', body: 'leader' });
    expect(await highest(db, 'jobs/1')).toBeNull();
  });

  test('a zombie without Fence-Key cannot make a new object under jobs/ a fence of its own either', async ({ app, db }) => {
    const res = await putObject(app, 'jobs/new-by-zombie', 5, 'zombie');
    expect(res.statusCode, res.body).toBe(409);
    expect(res.json()).toMatchObject({ error: 'stale_token', fenceKey: 'jobs', highestToken: '6' });
    expect(await storedObject(db, 'jobs/new-by-zombie')).toBeNull();
    expect(await highest(db, 'jobs/new-by-zombie')).toBeNull();
  });

  test('a write naming Fence-Key other gets 403 not_fenced naming the prefix and its fence key, even with a high token: nothing written, no fence raised', async ({
    app,
    db,
  }) => {
    const res = await putObject(app, 'jobs/1', 100, 'other', 'other');
    expect(res.statusCode, res.body).toBe(403);
    expect(res.json()).toMatchObject({ error: 'not_fenced', prefix: 'jobs/', fenceKey: 'jobs' });
    expect(res.json().message).toContain('"jobs/"');
    expect(res.json().message).toContain('"jobs"');
    expect(await storedObject(db, 'jobs/1')).toMatchObject({ fence_key: 'jobs', token: '6', body: 'leader' });
    expect(await highest(db, 'other')).toBeNull();
    expect(await highest(db, 'jobs')).toBe('6');
  });

  test('a new leader at token 7 without Fence-Key writes under jobs and raises it; the old leader is then stale even with Fence-Key jobs', async ({
    app,
    db,
  }) => {
    const res = await putObject(app, 'jobs/1', 7, 'new leader');
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ fenceKey: 'jobs', token: '7', version: 2 });
    expect(await highest(db, 'jobs')).toBe('7');
    expect(await highest(db, 'jobs/1')).toBeNull();
    const old = await putObject(app, 'jobs/2', 6, 'old leader', 'jobs');
    expect(old.statusCode).toBe(409);
    expect(await storedObject(db, 'jobs/2')).toBeNull();
  });

  test('DELETE the same: without Fence-Key a stale token gets 409 against jobs, another Fence-Key 403 not_fenced, the leader without the header deletes', async ({
    app,
    db,
  }) => {
    expect((await putObject(app, 'jobs/del', 7, 'keep', 'jobs')).statusCode).toBe(200);
    const stale = await deleteObject(app, 'jobs/del', 6);
    expect(stale.statusCode, stale.body).toBe(409);
    expect(stale.json()).toMatchObject({ error: 'stale_token', fenceKey: 'jobs', highestToken: '7' });
    // The trigger checks only inserts and updates: the proxy's resolution is what refuses this one.
    const other = await deleteObject(app, 'jobs/del', 100, 'other');
    expect(other.statusCode, other.body).toBe(403);
    expect(other.json()).toMatchObject({ error: 'not_fenced', prefix: 'jobs/', fenceKey: 'jobs' });
    expect(await storedObject(db, 'jobs/del')).toMatchObject({ fence_key: 'jobs', body: 'keep' });
    expect(await highest(db, 'other')).toBeNull();
    const leader = await deleteObject(app, 'jobs/del', 7);
    expect(leader.statusCode, leader.body).toBe(204);
    expect(await storedObject(db, 'jobs/del')).toBeNull();
    expect(await highest(db, 'jobs/del')).toBeNull();
  });

  test('a DELETE of a missing object under jobs/ without Fence-Key raises jobs, not a fence of the object key', async ({ app, db }) => {
    expect((await deleteObject(app, 'jobs/never', 8)).statusCode).toBe(204);
    expect(await highest(db, 'jobs')).toBe('8');
    expect(await highest(db, 'jobs/never')).toBeNull();
    expect((await putObject(app, 'jobs/1', 7, 'stale now', 'jobs')).statusCode).toBe(409);
  });

  test('objects outside every protected prefix keep their default fence: their own key', async ({ app }) => {
    const res = await putObject(app, 'jobsx/1', 1, 'free');
    expect(res.json()).toMatchObject({ fenceKey: 'jobsx/1' });
    expect((await putObject(app, 'free/1', 1, 'free', 'anything')).json()).toMatchObject({ fenceKey: 'anything' });
  });

  test('the longest protected prefix wins', async ({ app, db }) => {
    await protectPrefix(db.pool, 'jobs/urgent/', 'urgent');
    await app.fence.protectedPrefixes.refresh();
    expect((await putObject(app, 'jobs/urgent/1', 1, 'u')).json()).toMatchObject({ fenceKey: 'urgent' });
    expect((await putObject(app, 'jobs/urgent/1', 1, 'u', 'jobs')).json()).toMatchObject({
      error: 'not_fenced',
      prefix: 'jobs/urgent/',
      fenceKey: 'urgent',
    });
  });
});

describe('a prefix declared while the proxy runs', () => {
  test("is enforced by Postgres at once, while the proxy's copy is stale: a write naming another Fence-Key gets 403 not_fenced and nothing lands; the copy is read again", async ({
    app,
    db,
  }) => {
    await protectPrefix(db.pool, 'late/', 'late');
    expect(app.fence.protectedPrefixes.protecting('late/1')).toBeNull(); // stale
    const res = await putObject(app, 'late/1', 1, 'misfenced', 'other-late');
    expect(res.statusCode, res.body).toBe(403);
    expect(res.json()).toMatchObject({ error: 'not_fenced', prefix: 'late/', fenceKey: 'late' });
    expect(await storedObject(db, 'late/1')).toBeNull();
    expect(await highest(db, 'other-late')).toBeNull(); // the fence raise rolled back with the object
    expect(app.fence.protectedPrefixes.protecting('late/1')).toEqual({ prefix: 'late/', fenceKey: 'late' });
  });

  test("a DELETE naming another Fence-Key is refused by Postgres too while the proxy's copy is stale: 403 not_fenced, the object stays", async ({
    app,
    db,
  }) => {
    // Written under its own fence first (no prefix yet), at a token the delete's fence beats.
    expect((await putObject(app, 'gone/1', 1, 'kept', 'gone-own')).statusCode).toBe(200);
    await protectPrefix(db.pool, 'gone/', 'gone');
    expect(app.fence.protectedPrefixes.protecting('gone/1')).toBeNull(); // stale
    const res = await deleteObject(app, 'gone/1', 9, 'gone-own');
    expect(res.statusCode, res.body).toBe(403);
    expect(res.json().error).toBe('not_fenced');
    expect(await storedObject(db, 'gone/1')).not.toBeNull();
  });

  test("a write without Fence-Key that Postgres refused goes once more under the prefix's fence key", async ({ app, db }) => {
    await protectPrefix(db.pool, 'later/', 'later');
    expect(app.fence.protectedPrefixes.protecting('later/1')).toBeNull();
    const res = await putObject(app, 'later/1', 3, 'resolved after the refusal');
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ fenceKey: 'later', token: '3' });
    expect(await storedObject(db, 'later/1')).toMatchObject({ fence_key: 'later', token: '3' });
    expect(await highest(db, 'later')).toBe('3');
    expect(await highest(db, 'later/1')).toBeNull();
  });

  test("an object written under its own fence before the prefix was declared is moved to the prefix's fence only by a token at or above its fence's", async ({
    app,
    db,
  }) => {
    expect((await putObject(app, 'moved/1', 9, 'before')).json()).toMatchObject({ fenceKey: 'moved/1' });
    await protectPrefix(db.pool, 'moved/', 'moved');
    await app.fence.protectedPrefixes.refresh();
    const low = await putObject(app, 'moved/1', 8, 'low');
    expect(low.json()).toMatchObject({ error: 'stale_token', fenceKey: 'moved/1', highestToken: '9' });
    expect(await storedObject(db, 'moved/1')).toMatchObject({ fence_key: 'moved/1', body: 'before' });
    expect((await putObject(app, 'moved/1', 9, 'after')).json()).toMatchObject({ fenceKey: 'moved', token: '9' });
  });

  test('is resolved by the proxy itself after the refresh interval, without a refused statement', async ({ db }) => {
    const recorded = recordingStatements(db.pool);
    const app = testApp(recorded.pool, { protectedPrefixRefreshMs: 100 });
    await app.ready();
    try {
      await protectPrefix(db.pool, 'tick/', 'tick');
      const deadline = Date.now() + 5000;
      while (app.fence.protectedPrefixes.protecting('tick/1') === null && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 50));
      expect(app.fence.protectedPrefixes.protecting('tick/1')).toEqual({ prefix: 'tick/', fenceKey: 'tick' });
      recorded.names.length = 0;
      const res = await putObject(app, 'tick/1', 1, 'x', 'other-tick');
      expect(res.json()).toMatchObject({ error: 'not_fenced', prefix: 'tick/', fenceKey: 'tick' });
      expect(recorded.names.filter((n) => n.startsWith('fencepost_fenced'))).toEqual([]); // refused before any write statement
      expect((await putObject(app, 'tick/1', 1, 'x')).json()).toMatchObject({ fenceKey: 'tick' });
    } finally {
      await app.close();
    }
  });

  test('a batch holding one misfenced write commits the others: only the misfenced one gets 403', async ({ db }) => {
    const sizes: number[] = [];
    const app = testApp(db.pool, { protectedPrefixRefreshMs: NEVER_MS, concurrency: 1, onBatch: (n) => sizes.push(n) });
    await app.ready();
    try {
      await protectPrefix(db.pool, 'split/', 'split');
      const writes = Array.from({ length: 24 }, (_, i) => {
        const fenceKey = i === 12 ? 'other-split' : i % 2 === 0 ? 'split' : undefined;
        return { i, fenceKey, res: putObject(app, `split/${i}`, 4, `w${i}`, fenceKey) };
      });
      for (const w of writes) {
        const res = await w.res;
        if (w.fenceKey === 'other-split')
          expect(res.json(), `write ${w.i}`).toMatchObject({ error: 'not_fenced', prefix: 'split/', fenceKey: 'split' });
        else expect(res.json(), `write ${w.i}`).toMatchObject({ key: `split/${w.i}`, fenceKey: 'split', token: '4' });
      }
      expect(Math.max(...sizes)).toBeGreaterThan(1); // writes did share statements
      const { rows } = await db.pool.query<{ key: string; fence_key: string }>(
        `SELECT key, fence_key FROM fencepost.objects WHERE starts_with(key, 'split/') ORDER BY key`,
      );
      expect(rows).toHaveLength(23);
      expect(rows.every((r) => r.fence_key === 'split')).toBe(true);
      expect(await storedObject(db, 'split/12')).toBeNull();
      expect(await highest(db, 'other-split')).toBeNull();
    } finally {
      await app.close();
    }
  });
});

describe('keys with fence-key prefixes', () => {
  const keys = parseKeys(
    JSON.stringify({
      keys: [
        { name: 'objects-only', secret: 'objects-only-secret-0123', fenceKeyPrefixes: ['keyed/'] },
        { name: 'whole', secret: 'whole-secret-0123456789', fenceKeyPrefixes: ['keyed'] },
      ],
    }),
  );
  const put = (app: FastifyInstance, key: string, secret: string, fenceKey?: string) =>
    app.inject({
      method: 'PUT',
      url: `/v1/objects/${key}`,
      headers: { authorization: `Bearer ${secret}`, 'fencing-token': '1', ...(fenceKey === undefined ? {} : { 'fence-key': fenceKey }) },
      payload: 'x',
    });

  test("the resolved fence key must be within the key's prefixes: a key covering the objects but not the prefix's fence key gets 403 forbidden", async ({
    db,
  }) => {
    await protectPrefix(db.pool, 'keyed/', 'keyed-fence');
    const app = buildApp({
      store: new FenceStore(db.pool, STORE_DEFAULTS),
      bodyLimitBytes: 1024,
      auth: { keys, readAccess: 'open' },
      protectedPrefixRefreshMs: NEVER_MS,
    });
    await app.ready();
    try {
      const refused = await put(app, 'keyed/1', 'objects-only-secret-0123');
      expect(refused.statusCode, refused.body).toBe(403);
      expect(refused.json()).toMatchObject({ error: 'forbidden' });
      expect(refused.json().message).toContain('"keyed-fence"');
      expect(await storedObject(db, 'keyed/1')).toBeNull();
      // Naming a key it may write does not get around the prefix: 403 not_fenced.
      expect((await put(app, 'keyed/1', 'objects-only-secret-0123', 'keyed/1')).json()).toMatchObject({
        error: 'not_fenced',
        fenceKey: 'keyed-fence',
      });
      expect((await put(app, 'keyed/1', 'whole-secret-0123456789')).json()).toMatchObject({ fenceKey: 'keyed-fence', token: '1' });
    } finally {
      await app.close();
    }
  });

  test("a key outside the object's prefix learns nothing of its protection: 403 forbidden, not not_fenced", async ({ db }) => {
    await protectPrefix(db.pool, 'elsewhere/', 'elsewhere');
    const app = buildApp({
      store: new FenceStore(db.pool, STORE_DEFAULTS),
      bodyLimitBytes: 1024,
      auth: { keys, readAccess: 'open' },
      protectedPrefixRefreshMs: NEVER_MS,
    });
    await app.ready();
    try {
      const res = await put(app, 'elsewhere/1', 'whole-secret-0123456789', 'keyed');
      expect(res.json()).toMatchObject({ error: 'forbidden' });
      expect(res.json().message).not.toContain('"elsewhere"');
    } finally {
      await app.close();
    }
  });
});

describe('many concurrent writers on objects under a protected prefix', () => {
  test("no write with a token below the prefix fence's highest at its commit lands, with or without Fence-Key", async ({ app, db }) => {
    await protectPrefix(db.pool, 'race/', 'race');
    await app.fence.protectedPrefixes.refresh();
    // An observer in Postgres: at each commit, an object row whose token is below its fence's
    // highest (a raise committed before this write) is a stale write that landed.
    await db.pool.query(`CREATE TABLE public.stale_landings (key text, token bigint, fence_key text, highest bigint)`);
    await db.pool.query(`CREATE FUNCTION public.note_stale_landing() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE h bigint;
      BEGIN
        SELECT highest_token INTO h FROM fencepost.fences WHERE fence_key = NEW.fence_key;
        IF h IS NULL OR NEW.token < h OR NEW.fence_key <> 'race' THEN
          INSERT INTO public.stale_landings VALUES (NEW.key, NEW.token, NEW.fence_key, h);
        END IF;
        RETURN NULL;
      END $$`);
    await db.pool
      .query(`CREATE CONSTRAINT TRIGGER note_stale_landing AFTER INSERT OR UPDATE ON fencepost.objects DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW WHEN (starts_with(NEW.key, 'race/')) EXECUTE FUNCTION public.note_stale_landing()`);

    type Sent = {
      token: bigint;
      key: string;
      named: string | undefined;
      sentAt: number;
      ackedAt: number;
      status: number;
      body: { fenceKey?: string; version?: number; error?: string };
    };
    const sent: Sent[] = [];
    let current = 10n;
    let issued = 0;
    const headerChoices = [undefined, 'race', undefined, 'race', undefined, 'race', undefined, 'race', undefined, 'elsewhere-race'];
    const writer = async (w: number) => {
      for (let i = 0; i < 30; i++) {
        if (++issued % 9 === 0) current += 1n;
        const token = current - BigInt(Math.floor(Math.random() * 3));
        const key = `race/${(w * 7 + i) % 6}`;
        const named = headerChoices[Math.floor(Math.random() * headerChoices.length)];
        const sentAt = performance.now();
        const res = await putObject(app, key, token.toString(), `${w}:${i}`, named);
        sent.push({ token, key, named, sentAt, ackedAt: performance.now(), status: res.statusCode, body: res.json() });
      }
    };
    await Promise.all(Array.from({ length: 12 }, (_, w) => writer(w)));

    expect((await db.pool.query('SELECT * FROM public.stale_landings')).rows).toEqual([]);
    for (const s of sent) {
      if (s.named !== undefined && s.named !== 'race') expect(s.status, JSON.stringify(s.body)).toBe(403);
      else expect([200, 409], JSON.stringify(s.body)).toContain(s.status);
      if (s.status === 200 || s.status === 409) expect(s.body.fenceKey).toBe('race');
    }
    const accepted = sent.filter((s) => s.status === 200);
    expect(accepted.length).toBeGreaterThan(50);
    expect(sent.some((s) => s.status === 409)).toBe(true);
    // The fence history as the writers saw it: an accepted write's token is at or above every token
    // acknowledged before it was sent.
    const maxAckedBefore = (s: Sent) => accepted.filter((a) => a.ackedAt < s.sentAt).reduce((m, a) => (a.token > m ? a.token : m), 0n);
    for (const s of accepted)
      expect(s.token >= maxAckedBefore(s), `token ${s.token} accepted after a higher one was acknowledged`).toBe(true);
    // The final objects: each holds its highest accepted token, under race, and its version counts the accepted writes.
    const { rows } = await db.pool.query<{ key: string; fence_key: string; token: string; version: string }>(
      `SELECT key, fence_key, token::text, version::text FROM fencepost.objects WHERE starts_with(key, 'race/')`,
    );
    for (const row of rows) {
      const mine = accepted.filter((a) => a.key === row.key);
      expect(row.fence_key).toBe('race');
      expect(BigInt(row.token)).toBe(mine.reduce((m, a) => (a.token > m ? a.token : m), 0n));
      expect(Number(row.version)).toBe(mine.length);
    }
    expect(await highest(db, 'race')).toBe(accepted.reduce((m, a) => (a.token > m ? a.token : m), 0n).toString());
    expect(
      (await db.pool.query(`SELECT 1 FROM fencepost.fences WHERE starts_with(fence_key, 'race/') OR fence_key = 'elsewhere-race'`))
        .rowCount,
    ).toBe(0);
  });
});
