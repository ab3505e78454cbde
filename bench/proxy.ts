// Fenced PUT throughput and latency at 32 connections, beside two baselines measured in the same
// run: (a) the same upsert straight to Postgres through pg (same pool size and concurrency, no
// HTTP, no fence) and (b) the same HTTP path with the fence off. Load comes from autocannon in
// this process; each proxy is a separate `fencepost serve` process.
import autocannon from 'autocannon';
import pg from 'pg';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { migrate } from '../src/fence/migrate.ts';
import { spawnServe } from './serve.ts';
import { distribution } from '../src/election/advice.ts';
import { benchPostgres, fmt } from './support.ts';

export interface ThroughputResult {
  name: string;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  rssMb?: number;
}

export interface ProxyBenchOptions {
  durationS?: number;
  connections?: number;
  poolSize?: number;
  keySpace?: number;
  bodyBytes?: number;
}

const BODY = (n: number) => JSON.stringify({ payload: 'x'.repeat(Math.max(0, n - 16)) });

/** (a) The object upsert straight through pg: one statement per write, `connections` at once. */
async function directUpsert(url: string, o: Required<ProxyBenchOptions>): Promise<ThroughputResult> {
  const pool = new pg.Pool({ connectionString: url, max: o.poolSize });
  const body = Buffer.from(BODY(o.bodyBytes));
  const latencies: number[] = [];
  let n = 0;
  let errors = 0;
  const text = `INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
    VALUES ($1, $1, $2, 1, 'application/json', $3)
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, version = o.version + 1, body = EXCLUDED.body, updated_at = now()
    RETURNING version`;
  const run = async (until: number, record: boolean) => {
    while (performance.now() < until) {
      const key = `bench-${Math.floor(Math.random() * o.keySpace)}`;
      const t = performance.now();
      try {
        await pool.query({ name: 'bench_upsert', text, values: [key, '1', body] });
      } catch {
        errors++;
      }
      if (record) {
        latencies.push(performance.now() - t);
        n++;
      }
    }
  };
  await Promise.all(Array.from({ length: o.connections }, () => run(performance.now() + 1000, false))); // warm-up
  const start = performance.now();
  await Promise.all(Array.from({ length: o.connections }, () => run(start + o.durationS * 1000, true)));
  const elapsed = (performance.now() - start) / 1000;
  await pool.end();
  const d = distribution(latencies);
  return { name: '(a) direct pg upsert', rps: n / elapsed, p50Ms: d.median, p99Ms: d.p99, errors };
}

/** autocannon PUTs against a running proxy, random keys from the key space, token 1. */
export async function loadProxy(name: string, url: string, o: Required<ProxyBenchOptions>, rss?: () => number): Promise<ThroughputResult> {
  const body = BODY(o.bodyBytes);
  const opts = {
    url,
    connections: o.connections,
    pipelining: 1,
    method: 'PUT' as const,
    headers: { 'content-type': 'application/json', 'fencing-token': '1' },
    body,
    requests: [{ setupRequest: (req: autocannon.Request) => ({ ...req, path: `/v1/objects/bench-${Math.floor(Math.random() * o.keySpace)}` }) }],
  };
  await autocannon({ ...opts, duration: 1 }); // warm-up: JIT, prepared statements, pool
  let peakRss = 0;
  const sampler = rss ? setInterval(() => (peakRss = Math.max(peakRss, rss())), 200) : null;
  const r = await autocannon({ ...opts, duration: o.durationS });
  if (sampler) clearInterval(sampler);
  const non2xx = r.non2xx + r.errors + r.timeouts;
  return { name, rps: r.requests.average, p50Ms: r.latency.p50, p99Ms: r.latency.p99, errors: non2xx, ...(rss ? { rssMb: peakRss / 1024 / 1024 } : {}) };
}

export async function runProxyBench(options: ProxyBenchOptions = {}): Promise<ThroughputResult[]> {
  const o: Required<ProxyBenchOptions> = { durationS: 10, connections: 32, poolSize: 10, keySpace: 10_000, bodyBytes: 256, ...options };
  const db = await benchPostgres('fencepost_bench_proxy');
  const results: ThroughputResult[] = [];
  try {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    await migrate(pool);
    await pool.end();
    results.push(await directUpsert(db.url, o));
    const env = { DATABASE_URL: db.url, FENCEPOST_POOL_SIZE: String(o.poolSize) };
    for (const [name, extra, mode] of [
      ['fenced PUT (proxy)', {}, 'strict'],
      ['(b) unfenced PUT (same HTTP path, fence off)', {}, 'off'],
      ['fenced PUT, coalescing off (FENCEPOST_MAX_BATCH=1)', { FENCEPOST_MAX_BATCH: '1' }, 'strict'],
    ] as const) {
      const proxy = await spawnServe({ ...env, ...extra }, mode);
      try {
        results.push(await loadProxy(name, proxy.url, o, proxy.rss));
      } finally {
        await proxy.stop();
      }
    }
    // Two proxy instances on one database, the 32 connections split between them.
    const two = await Promise.all([spawnServe(env), spawnServe(env)]);
    try {
      const half = { ...o, connections: Math.ceil(o.connections / 2) };
      const [r1, r2] = await Promise.all([loadProxy('a', two[0]!.url, half), loadProxy('b', two[1]!.url, half)]);
      results.push({
        name: 'fenced PUT, 2 proxy instances',
        rps: r1.rps + r2.rps,
        p50Ms: Math.max(r1.p50Ms, r2.p50Ms),
        p99Ms: Math.max(r1.p99Ms, r2.p99Ms),
        errors: r1.errors + r2.errors,
      });
    } finally {
      await Promise.all(two.map((p) => p.stop()));
    }
  } finally {
    await db.stop();
  }
  return results;
}

export function proxyTable(results: ThroughputResult[]): string {
  const base = results.find((r) => r.name.startsWith('(a)'));
  const unfenced = results.find((r) => r.name.startsWith('(b)'));
  const lines = ['| path (32 connections) | req/s | p50 ms | p99 ms | errors | vs (a) | vs (b) | proxy RSS peak |', '|---|---:|---:|---:|---:|---:|---:|---:|'];
  for (const r of results) {
    lines.push(
      `| ${r.name} | ${fmt(r.rps, 0)} | ${fmt(r.p50Ms, 2)} | ${fmt(r.p99Ms, 2)} | ${r.errors} | ${base ? fmt(r.rps / base.rps, 2) + '×' : '–'} | ${unfenced ? fmt(r.rps / unfenced.rps, 2) + '×' : '–'} | ${r.rssMb === undefined ? '–' : fmt(r.rssMb, 0) + ' MiB'} |`,
    );
  }
  return lines.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const results = await runProxyBench({ durationS });
  console.log(proxyTable(results));
}
