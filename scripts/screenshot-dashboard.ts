// Regenerates docs/dashboard.png: a throwaway embedded Postgres, a proxy, an hour of realistic
// traffic (leaders writing, a zombie ex-leader and a flapping election being refused), a ZooKeeper
// with two real elections the forgery guard maps, then the dashboard in headless Chromium. Usage: npx
// tsx scripts/screenshot-dashboard.ts [out.png]
import { STORE_DEFAULTS } from '../src/proxy/config.ts';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { migrate } from '../src/fence/migrate.ts';
import { FenceStore } from '../src/fence/store.ts';
import { buildApp } from '../src/proxy/http/app.ts';
import { createPool } from '../src/proxy/server.ts';
import { LocalZooKeeper } from '../src/demo/local-zookeeper.ts';
import { startPostgres } from '../tools/postgres.ts';
import { onFreePort } from '../tools/ports.ts';
import { Election } from '../src/election/election.ts';
import { ZkSession } from '../src/election/zk-session.ts';
import { launchChromium } from '../tools/chromium.ts';

const REPO = join(import.meta.dirname, '..');
const out = process.argv[2] ?? join(REPO, 'docs', 'dashboard.png');

/** ZooKeeper-style sequence suffix, as writers send it. */
const zk = (n: number) => String(n).padStart(10, '0');

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-screenshot-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const pg = await startPostgres({ dataDir: join(dir, 'pg') });
  const pool = createPool(pg.url, 10);
  // Two real elections the forgery guard maps: jobs/ (its leader has raised its fence) and
  // billing/ (a new leader whose fence advance has not arrived).
  const zkServer = await LocalZooKeeper.start({ baseDir: join(dir, 'zk') });
  const auth = { user: 'elector', password: 'screenshot' };
  const app = buildApp({
    store: new FenceStore(pool, { ...STORE_DEFAULTS, concurrency: 8 }),
    bodyLimitBytes: 1 << 20,
    forgeryGuard: {
      zkConnect: zkServer.connectString,
      electionAuth: auth,
      mappings: [
        { prefix: 'jobs/', electionPath: '/prod/jobs' },
        { prefix: 'billing/', electionPath: '/prod/billing' },
      ],
    },
  });
  const elections: Election[] = [];
  try {
    const root = await ZkSession.open({ connect: zkServer.connectString, sessionTimeoutMs: 4000 });
    await root.mkdirp('/prod');
    await root.close();
    const candidates = async (path: string, n: number) => {
      for (let i = 0; i < n; i++) {
        const e = new Election({
          connect: zkServer.connectString,
          path,
          id: `${path.split('/').pop()}-${i}`,
          sessionTimeoutMs: 4000,
          auth,
        });
        elections.push(e);
        await e.start();
      }
    };
    await candidates('/prod/billing', 1);
    await elections[0]!.close(); // billing's first leader left: its successor has not raised yet
    await candidates('/prod/billing', 2);
    await candidates('/prod/jobs', 3);
    await migrate(pool);
    const url = await onFreePort((port) => app.listen({ host: '127.0.0.1', port }));
    const write = async (key: string, fenceKey: string, token: number, writer: string) => {
      const res = await fetch(`${url}/v1/objects/${encodeURIComponent(key)}`, {
        method: 'PUT',
        headers: { 'fencing-token': zk(token), 'fence-key': fenceKey, 'writer-id': writer, 'content-type': 'application/json' },
        body: JSON.stringify({ key, at: Date.now() }),
      });
      if (res.status !== 200 && res.status !== 409) throw new Error(`${key}: HTTP ${res.status}`);
    };
    await write('billing/invoices', 'billing/invoices', 0, 'billing-0');
    await write('jobs/nightly', 'jobs/nightly', 0, 'jobs-0');
    const leaders: [fenceKey: string, token: number, writes: number][] = [
      ['orders', 412, 1480],
      ['payments', 391, 960],
      ['inventory/eu-west', 2207, 640],
      ['inventory/us-east', 2198, 610],
      ['ledger', 57, 350],
      ['sessions', 1034, 260],
      ['reports/daily', 12, 40],
    ];
    // The current leaders' traffic, 16 writes at a time.
    const jobs = leaders.flatMap(([fenceKey, token, n]) =>
      Array.from({ length: n }, (_, i) => () => write(`${fenceKey}/${i % 97}`, fenceKey, token, `replica-${token % 3}`)),
    );
    for (let i = 0; i < jobs.length; i += 16) await Promise.all(jobs.slice(i, i + 16).map((j) => j()));
    // Refused, in the order they are dated below (ids follow time, as in real life): a stray job on
    // ledger, a flapping election on inventory/eu-west (each old leader writes once more), a zombie
    // ex-leader of payments (paused past its session), one late write on orders.
    for (let i = 0; i < 6; i++) await write('ledger/balance', 'ledger', 55, 'nightly-reconcile');
    for (let t = 2194; t < 2207; t++)
      for (let i = 0; i < 5; i++) await write(`inventory/eu-west/${i}`, 'inventory/eu-west', t, `replica-${t % 3}`);
    for (let i = 0; i < 74; i++) await write(`payments/${i % 31}`, 'payments', 387, 'replica-0 (pid 4121)');
    await write('orders/8812', 'orders', 409, 'replica-1');
    // Spread the rejections over the last hour, as they happened: demo data only.
    const { rows } = await pool.query<{ id: string; fence_key: string }>('SELECT id, fence_key FROM fencepost.rejections ORDER BY id');
    const nth = new Map<string, number>();
    const agoSeconds = rows.map((r) => {
      const i = nth.get(r.fence_key) ?? 0;
      nth.set(r.fence_key, i + 1);
      if (r.fence_key === 'ledger') return 52 * 60 - i * 25; // a stray job, long ago
      if (r.fence_key === 'inventory/eu-west') return 41 * 60 - i * 5.5; // a flapping election: 6 minutes of refusals
      if (r.fence_key === 'payments') return 14 * 60 * (1 - Math.sqrt(i / 74)) + 15; // a zombie ex-leader, getting busier
      return 8;
    });
    await pool.query(
      `UPDATE fencepost.rejections r SET rejected_at = now() - make_interval(secs => a.secs)
       FROM unnest($1::bigint[], $2::float8[]) AS a(id, secs) WHERE r.id = a.id`,
      [rows.map((r) => r.id), agoSeconds],
    );
    // The chart reads per-minute counts kept as rejections are recorded: count them again as dated.
    await pool.query(`DELETE FROM fencepost.rejection_minutes`);
    await pool.query(`INSERT INTO fencepost.rejection_minutes (minute, shard, count)
      SELECT date_trunc('minute', rejected_at), 0, count(*) FROM fencepost.rejections GROUP BY 1`);
    // When each leader raised its fence (the Fences table's "since"), as the story above has it.
    const raised: Record<string, number> = {
      payments: 16,
      'inventory/eu-west': 35,
      ledger: 190,
      orders: 52,
      'inventory/us-east': 130,
      sessions: 300,
      'reports/daily': 1200,
    };
    await pool.query(
      `UPDATE fencepost.fences f SET updated_at = now() - make_interval(mins => a.mins)
       FROM unnest($1::text[], $2::int[]) AS a(fence_key, mins) WHERE f.fence_key = a.fence_key`,
      [Object.keys(raised), Object.values(raised)],
    );

    const browser = await launchChromium();
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
      await page.goto(`${url}/dashboard?raiseGraceMs=0`);
      await page.locator('#status[data-state="live"]').waitFor();
      await page.screenshot({ path: out, fullPage: true });
      process.stdout.write(`wrote ${out}\n`);
    } finally {
      await browser.close();
    }
  } finally {
    await Promise.all(elections.map((e) => e.close()));
    await app.close();
    await zkServer.stop();
    await pool.end();
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
