// Every door counted the same way: HTTP writes, POST /v1/transactions and the SQL endpoint each
// count accepted, rejected and failed writes in /metrics (fencepost_writes_total{door=…}), and the
// three views agree exactly: /metrics summed over doors, /v1/stats (what the live dashboard reads)
// and the database's own fence_stats. A rejection the log could not record is counted apart.
import { describe, expect } from 'vitest';
import { sqlTest } from '../support/fixtures.ts';
import { fenceOptions, type SqlProxy } from '../support/sql.ts';
import type { TestDatabase } from '../support/db.ts';
import { DOORS } from '../../src/proxy/metrics.ts';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.door_items (id int PRIMARY KEY)', privileges: 'SELECT, INSERT' },
]);

/** `name{labels}` → value, labels as printed. */
async function scrape(sql: SqlProxy): Promise<Map<string, number>> {
  const res = await fetch(`${sql.proxy.url}/metrics`);
  expect(res.status).toBe(200);
  const out = new Map<string, number>();
  for (const line of (await res.text()).split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** fencepost_writes_total summed over the series matching every given label. */
function writes(m: Map<string, number>, labels: Record<string, string>): number {
  let n = 0;
  for (const [name, v] of m) {
    if (!name.startsWith('fencepost_writes_total{')) continue;
    if (Object.entries(labels).every(([k, val]) => name.includes(`${k}="${val}"`))) n += v;
  }
  return n;
}

const stats = async (sql: SqlProxy) => (await (await fetch(`${sql.proxy.url}/v1/stats`)).json()) as { accepted: number; rejected: number };
const dbCounts = async (db: TestDatabase) =>
  (
    await db.pool.query<{ accepted: number; rejected: number }>(
      'SELECT coalesce(sum(accepted), 0)::int AS accepted, coalesce(sum(rejected), 0)::int AS rejected FROM fencepost.fence_stats',
    )
  ).rows[0]!;
const rejectionsByDoor = async (db: TestDatabase) =>
  new Map(
    (await db.pool.query<{ door: string; n: number }>('SELECT door, count(*)::int AS n FROM fencepost.rejections GROUP BY door')).rows.map(
      (r) => [r.door, r.n],
    ),
  );
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );

const put = (sql: SqlProxy, key: string, token: number) =>
  fetch(`${sql.proxy.url}/v1/objects/${key}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token), 'fence-key': 'doors', 'content-type': 'application/json' },
    body: '{}',
  });
const tx = (sql: SqlProxy, token: number, id: number) =>
  fetch(`${sql.proxy.url}/v1/transactions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      fences: [{ key: 'doors', token: String(token) }],
      statements: [{ sql: 'INSERT INTO public.door_items VALUES ($1)', params: [id] }],
    }),
  });

describe('every door in /metrics', () => {
  test('HTTP, /v1/transactions and the SQL endpoint: /metrics, /v1/stats and fence_stats agree exactly', async ({ sql, db }) => {
    await sql.proxy.app.fence.provision();
    const before = await scrape(sql);
    for (const door of DOORS) expect(writes(before, { door }), door).toBe(0);

    // HTTP: two accepted puts, one stale.
    expect((await put(sql, 'doors/1', 5)).status).toBe(200);
    expect((await put(sql, 'doors/2', 5)).status).toBe(200);
    expect((await put(sql, 'doors/1', 4)).status).toBe(409);
    // POST /v1/transactions: one committed, two stale.
    expect((await tx(sql, 5, 1)).status).toBe(200);
    expect((await tx(sql, 3, 2)).status).toBe(409);
    expect((await tx(sql, 4, 3)).status).toBe(409);
    // SQL endpoint: committed implicit, extended and explicit transactions (3); a rolled-back one,
    // a failed one (duplicate key) and a failed block's COMMIT (a rollback): none committed.
    const leader = await sql.connect('door-leader', { options: fenceOptions(5, 'doors') });
    await leader.query('INSERT INTO door_items VALUES (10)');
    await leader.query('INSERT INTO door_items VALUES ($1)', [11]);
    await leader.query('BEGIN');
    await leader.query('INSERT INTO door_items VALUES (12)');
    await leader.query('COMMIT');
    await leader.query('BEGIN');
    await leader.query('INSERT INTO door_items VALUES (13)');
    await leader.query('ROLLBACK');
    expect(await code(leader.query('INSERT INTO door_items VALUES (10)'))).toBe('23505');
    await leader.query('BEGIN');
    expect(await code(leader.query('SELECT 1/0'))).toBe('22012');
    await leader.query('COMMIT');
    // A savepoint rolled back inside a block that then commits: one committed transaction (4).
    await leader.query(
      'BEGIN; SAVEPOINT s; INSERT INTO door_items VALUES (14); ROLLBACK TO SAVEPOINT s; INSERT INTO door_items VALUES (15); COMMIT',
    );
    await leader.end();
    // A zombie on SQL, twice: FP409, refused at connect.
    expect(await code(sql.connect('door-zombie', { options: fenceOptions(2, 'doors') }))).toBe('FP409');
    expect(await code(sql.connect('door-zombie', { options: fenceOptions(2, 'doors') }))).toBe('FP409');
    // A malformed token on each of the two doors that read one from the writer: invalid, not an error.
    expect(await code(sql.connect('door-malformed', { options: fenceOptions('5x', 'doors') }))).toBe('FP400');

    // The SQL endpoint records its refusals after it answers.
    await expect.poll(async () => (await rejectionsByDoor(db)).get('sql') ?? 0).toBe(2);
    const m = await scrape(sql);
    expect(writes(m, { door: 'http', outcome: 'accepted' })).toBe(2);
    expect(writes(m, { door: 'http', outcome: 'rejected' })).toBe(1);
    expect(writes(m, { door: 'transaction', outcome: 'accepted' })).toBe(1);
    expect(writes(m, { door: 'transaction', outcome: 'rejected' })).toBe(2);
    expect(writes(m, { door: 'sql', operation: 'transaction', outcome: 'accepted' })).toBe(4);
    expect(writes(m, { door: 'sql', outcome: 'rejected' })).toBe(2);
    expect(writes(m, { door: 'sql', outcome: 'rolled_back' })).toBe(1);
    expect(writes(m, { door: 'sql', outcome: 'invalid' })).toBe(3); // two failed transactions, one malformed token
    expect(writes(m, { outcome: 'error' })).toBe(0);
    for (const door of DOORS) expect(m.get(`fencepost_rejections_unrecorded_total{door="${door}"}`), door).toBe(0);
    expect(m.get('fencepost_rejections_total{door="sql",reason="stale_token"}')).toBe(2);

    const accepted = writes(m, { outcome: 'accepted' });
    const rejected = writes(m, { outcome: 'rejected' });
    expect({ accepted, rejected }).toEqual({ accepted: 7, rejected: 5 });
    expect(await stats(sql)).toMatchObject({ accepted, rejected });
    expect(await dbCounts(db)).toEqual({ accepted, rejected });
    const byDoor = await rejectionsByDoor(db);
    for (const door of DOORS) expect(byDoor.get(door) ?? 0, door).toBe(writes(m, { door, outcome: 'rejected' }));
  });

  test('rejections the log cannot record are refused all the same and counted as unrecorded, per door', async ({ sql, db }) => {
    // The rejection log fails (as it does with Postgres down) while the fences still work.
    await db.pool.query(
      `CREATE FUNCTION public.refuse_rejection() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'rejection log unavailable'; END $$`,
    );
    await db.pool.query(
      'CREATE TRIGGER refuse_rejection BEFORE INSERT ON fencepost.rejections FOR EACH ROW EXECUTE FUNCTION public.refuse_rejection()',
    );
    try {
      const before = await scrape(sql);
      expect((await put(sql, 'doors/1', 1)).status).toBeGreaterThanOrEqual(500);
      expect(await code(sql.connect('door-zombie-2', { options: fenceOptions(1, 'doors') }))).toBe('FP409');
      const unrecorded = (m: Map<string, number>, door: string) => m.get(`fencepost_rejections_unrecorded_total{door="${door}"}`) ?? 0;
      await expect.poll(async () => unrecorded(await scrape(sql), 'sql') - unrecorded(before, 'sql')).toBe(1);
      const after = await scrape(sql);
      expect(unrecorded(after, 'http') - unrecorded(before, 'http')).toBe(1);
      expect(writes(after, { door: 'sql', outcome: 'rejected' }) - writes(before, { door: 'sql', outcome: 'rejected' })).toBe(1);
      expect(writes(after, { door: 'http', outcome: 'error' }) - writes(before, { door: 'http', outcome: 'error' })).toBe(1);
    } finally {
      await db.pool.query('DROP TRIGGER refuse_rejection ON fencepost.rejections');
    }
  });
});
