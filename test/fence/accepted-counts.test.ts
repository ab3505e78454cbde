// The SQL doors' accepted counts, kept by each proxy and added to the counters in batches
// (src/fence/accepted-counts.ts). Invariant: a flush that fails adds nothing and loses nothing;
// what it could not add is reported (`unflushed`, /v1/stats's `unflushedAccepted`) and added
// exactly once by the next flush that succeeds.
import pg from 'pg';
import { expect } from 'vitest';
import { AcceptedCounts } from '../../src/fence/accepted-counts.ts';
import { roleTest as test } from '../support/fixtures.ts';

test('a failed flush keeps its counts and says how many; the next one adds them exactly once', async ({ db, pgRole }) => {
  // The counts' pool runs as a role that may not write the counters yet (permission is checked
  // per statement, so a GRANT lets the same connection's next flush through).
  const pool = new pg.Pool({ connectionString: db.url, max: 1, options: `-c role=${pgRole}` });
  const counts = new AcceptedCounts(pool);
  const accepted = async (key: string) =>
    Number(
      (await db.pool.query('SELECT coalesce(sum(accepted), 0)::text AS n FROM fencepost.fence_counts WHERE fence_key = $1', [key])).rows[0]
        .n,
    );
  try {
    counts.add(['flush/a']);
    counts.add(['flush/a', 'flush/b']);
    await expect(counts.flush()).rejects.toMatchObject({ code: '42501' });
    expect(counts.unflushed).toBe(3);
    counts.add(['flush/b']); // counted while the failed batch waits
    await expect(counts.flush()).rejects.toMatchObject({ code: '42501' });
    expect(counts.unflushed).toBe(4);
    expect([await accepted('flush/a'), await accepted('flush/b')]).toEqual([0, 0]);

    await db.pool.query(
      `GRANT USAGE ON SCHEMA fencepost TO ${pgRole}; GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA fencepost TO ${pgRole}`,
    );
    await counts.flush();
    expect(counts.unflushed).toBe(0);
    await counts.flush(); // nothing left: adds nothing
    expect([await accepted('flush/a'), await accepted('flush/b')]).toEqual([2, 2]);
  } finally {
    await counts.stop();
    await pool.end();
  }
});
