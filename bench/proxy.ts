// Fenced PUT throughput and latency at 32 connections, beside two baselines measured in the same
// run: (a) the same upsert straight to Postgres through pg (same pool size and concurrency, no
// HTTP, no fence) and (b) the same HTTP path with the fence off. Load comes from autocannon in
// this process; each proxy is a separate `fencepost serve` process. Each path also reads CPU per
// request of Postgres, the proxy and this process (the load generator; bench/cpu.ts) and runs once
// more with Postgres pinned to one core (bench/placement.ts, BENCH_PLACEMENT).
import autocannon from 'autocannon';
import pg from 'pg';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { migrate } from '../src/fence/migrate.ts';
import { spawnServe, type ServeProcess } from './serve.ts';
import { distribution } from '../src/election/advice.ts';
import { benchPostgres, fmt } from './support.ts';
import { cpuTable, measureCpu, postmasterPid, selfProbe, treeProbe, type CpuProbe, type CpuRow, type CpuWindow } from './cpu.ts';
import { pinnedDescription, place, placements, type Placement } from './placement.ts';

export interface ThroughputResult {
  name: string;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  rssMb?: number;
  placement: Placement;
  /** Requests (or direct upserts) in the measured window, and the CPU over it. */
  ops: number;
  cpu: CpuWindow;
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
async function directUpsert(
  url: string,
  o: Required<ProxyBenchOptions>,
  placement: Placement,
  probes: readonly CpuProbe[],
): Promise<ThroughputResult> {
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
  const { cpu } = await measureCpu(probes, () =>
    Promise.all(Array.from({ length: o.connections }, () => run(start + o.durationS * 1000, true))),
  );
  const elapsed = (performance.now() - start) / 1000;
  await pool.end();
  const d = distribution(latencies);
  return { name: '(a) direct pg upsert', rps: n / elapsed, p50Ms: d.median, p99Ms: d.p99, errors, placement, ops: n, cpu };
}

function cannonOptions(url: string, o: Required<ProxyBenchOptions>) {
  const body = BODY(o.bodyBytes);
  return {
    url,
    connections: o.connections,
    pipelining: 1,
    method: 'PUT' as const,
    headers: { 'content-type': 'application/json', 'fencing-token': '1' },
    body,
    requests: [
      { setupRequest: (req: autocannon.Request) => ({ ...req, path: `/v1/objects/bench-${Math.floor(Math.random() * o.keySpace)}` }) },
    ],
  };
}

/** A second of the same load, unmeasured: JIT, prepared statements, pool. */
async function warmUp(url: string, o: Required<ProxyBenchOptions>): Promise<void> {
  await autocannon({ ...cannonOptions(url, o), duration: 1 });
}

/**
 * autocannon PUTs against a running proxy, random keys from the key space, token 1, after a warm-up
 * (unless `at.warm`: done already), the CPU of `at.probes` read over the measured run.
 */
export async function loadProxy(
  name: string,
  url: string,
  o: Required<ProxyBenchOptions>,
  at: { placement: Placement; probes: readonly CpuProbe[]; warm?: boolean },
  rss?: () => number,
): Promise<ThroughputResult> {
  const opts = cannonOptions(url, o);
  if (!at.warm) await warmUp(url, o);
  let peakRss = 0;
  const sampler = rss ? setInterval(() => (peakRss = Math.max(peakRss, rss())), 200) : null;
  const { result: r, cpu } = await measureCpu(at.probes, () => autocannon({ ...opts, duration: o.durationS }));
  if (sampler) clearInterval(sampler);
  const non2xx = r.non2xx + r.errors + r.timeouts;
  return {
    name,
    rps: r.requests.average,
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    errors: non2xx,
    placement: at.placement,
    ops: r.requests.total,
    cpu,
    ...(rss ? { rssMb: peakRss / 1024 / 1024 } : {}),
  };
}

export async function runProxyBench(options: ProxyBenchOptions = {}): Promise<ThroughputResult[]> {
  const o: Required<ProxyBenchOptions> = { durationS: 10, connections: 32, poolSize: 10, keySpace: 10_000, bodyBytes: 256, ...options };
  const db = await benchPostgres('fencepost_bench_proxy');
  const results: ThroughputResult[] = [];
  const postmaster = await postmasterPid(db.url);
  const pgProbes = postmaster === null ? [] : [treeProbe('postgres', postmaster)];
  /** The proxies' CPU, Postgres's and this process's (autocannon or node-postgres: the load generator). */
  const probes = (proxies: readonly ServeProcess[]): CpuProbe[] => [
    ...pgProbes,
    ...proxies.map((p) => treeProbe('proxy', p.pid)),
    selfProbe(),
  ];
  const placed = (proxies: readonly ServeProcess[]) => ({ postgres: postmaster, others: proxies.map((p) => p.pid) });
  try {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    await migrate(pool);
    await pool.end();
    for (const placement of placements()) {
      try {
        place(placement, placed([]));
        results.push(await directUpsert(db.url, o, placement, probes([])));
        const env = { DATABASE_URL: db.url, FENCEPOST_POOL_SIZE: String(o.poolSize) };
        for (const [name, extra, mode] of [
          ['fenced PUT (proxy)', {}, 'strict'],
          ['(b) unfenced PUT (same HTTP path, fence off)', {}, 'off'],
          ['fenced PUT, coalescing off (FENCEPOST_MAX_BATCH=1)', { FENCEPOST_MAX_BATCH: '1' }, 'strict'],
        ] as const) {
          const proxy = await spawnServe({ ...env, ...extra }, mode);
          try {
            place(placement, placed([proxy]));
            results.push(await loadProxy(name, proxy.url, o, { placement, probes: probes([proxy]) }, proxy.rss));
          } finally {
            await proxy.stop();
          }
        }
        // Two proxy instances on one database, the 32 connections split between them.
        const two = await Promise.all([spawnServe(env), spawnServe(env)]);
        try {
          place(placement, placed(two));
          const half = { ...o, connections: Math.ceil(o.connections / 2) };
          // Each autocannon counts its own requests; the CPU is read once, over both (and both proxies).
          await Promise.all(two.map((p) => warmUp(p.url, half)));
          const { result: halves, cpu } = await measureCpu(probes(two), () =>
            Promise.all([
              loadProxy('a', two[0]!.url, half, { placement, probes: [], warm: true }),
              loadProxy('b', two[1]!.url, half, { placement, probes: [], warm: true }),
            ]),
          );
          const [r1, r2] = halves;
          results.push({
            name: 'fenced PUT, 2 proxy instances',
            rps: r1.rps + r2.rps,
            p50Ms: Math.max(r1.p50Ms, r2.p50Ms),
            p99Ms: Math.max(r1.p99Ms, r2.p99Ms),
            errors: r1.errors + r2.errors,
            placement,
            ops: r1.ops + r2.ops,
            cpu,
          });
        } finally {
          await Promise.all(two.map((p) => p.stop()));
        }
      } finally {
        place('shared', placed([]));
      }
    }
  } finally {
    await db.stop();
  }
  return results;
}

/** Every process on every core (the CPU table has the pinned runs too). */
export function proxyTable(all: ThroughputResult[]): string {
  const results = all.filter((r) => r.placement === 'shared');
  const base = results.find((r) => r.name.startsWith('(a)'));
  const unfenced = results.find((r) => r.name.startsWith('(b)'));
  const lines = [
    '| path (32 connections) | req/s | p50 ms | p99 ms | errors | vs (a) | vs (b) | proxy RSS peak |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of results) {
    lines.push(
      `| ${r.name} | ${fmt(r.rps, 0)} | ${fmt(r.p50Ms, 2)} | ${fmt(r.p99Ms, 2)} | ${r.errors} | ${base ? fmt(r.rps / base.rps, 2) + '×' : '–'} | ${unfenced ? fmt(r.rps / unfenced.rps, 2) + '×' : '–'} | ${r.rssMb === undefined ? '–' : fmt(r.rssMb, 0) + ' MiB'} |`,
    );
  }
  return lines.join('\n');
}

/** The CPU table's rows (bench/cpu.ts), compared with (a), the direct upsert. */
export function proxyCpuRows(results: readonly ThroughputResult[]): CpuRow[] {
  return results.map((r) => ({
    scenario: 'PUT /v1/objects (bench/proxy.ts: autocannon in the bench process)',
    path: r.name,
    direct: r.name.startsWith('(a)'),
    placement: r.placement,
    perS: r.rps,
    p50Ms: r.p50Ms,
    p99Ms: r.p99Ms,
    ops: r.ops,
    failed: r.errors,
    cpu: r.cpu,
  }));
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const results = await runProxyBench({ durationS });
  console.log(`${proxyTable(results)}\n\n${cpuTable(proxyCpuRows(results), { pinnedCpus: pinnedDescription() })}`);
}
