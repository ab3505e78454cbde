// The tenant-isolation run: tenant B's leader alone (the solo run), then case after case of the
// same workload while tenant A runs a seeded mix of hostile actions (attacks.ts). Invariant, per
// case: B's p99 write latency and p99 raise latency within BOUND of the solo runs' (the first one,
// and one just before the case, whichever is slower), no B error (its workload never goes stale,
// so it has none of its own), and B's data exactly what B wrote. A case that misses only the
// latency bound runs once more and is judged by that second run: a freeze comes back with its
// attack, a stall of a busy box does not.
import pg from 'pg';
import { Prng } from '../chaos/prng.ts';
import { allAttacks, pickMix, type Attack, type AttackOutcome } from './attacks.ts';
import { AttackerProcess } from './attacker.ts';
import { http, tenantABackends, type Endpoints, type Tenants } from './tenants.ts';
import { percentile, runVictim, type VictimRun } from './victim.ts';

/**
 * B's bound: max(FACTOR × solo p99, solo p99 + SLACK_MS). Why these numbers: on a shared, busy
 * 2-core box the same workload's p99 moves by 2–3× between runs (other suites, GC, the attacker's
 * own CPU: A is a legitimate client with as much right to the cores as B), and scheduling stalls
 * add a few hundred ms; a freeze is a lock wait, at least a second long (the proxy's lock timeout,
 * FENCEPOST_LOCK_TIMEOUT_MS, and raise wait, FENCEPOST_RAISE_WAIT_MS, are 1 s; a direct login's
 * lock_timeout is the whole window). So the bound lets load through and stops a freeze whenever
 * solo p99 is under 500 ms; a run whose solo p99 is above that says so (`soloTooSlow`).
 */
export const BOUND = Object.freeze({ factor: 3, slackMs: 500 });

export function boundFor(soloP99: number): number {
  return Math.max(BOUND.factor * soloP99, soloP99 + BOUND.slackMs);
}

export interface Latency {
  writeP99: number;
  raiseP99: number;
  writes: number;
  raises: number;
}

export interface CaseResult {
  index: number;
  attacks: string[];
  knownOpen: boolean;
  outcomes: Record<string, AttackOutcome>;
  b: Latency;
  bErrors: string[];
  /** What broke the invariant: empty when the case held. */
  violations: string[];
  /** A first try's missed latency bound, when the case ran again (see runTenancy). */
  firstTry?: string[];
}

export interface TenancyReport {
  seed: number;
  solo: Latency;
  bound: { writeMs: number; raiseMs: number };
  soloTooSlow: boolean;
  cases: CaseResult[];
  attackCount: number;
  elapsedMs: number;
}

export interface TenancyOptions {
  seed: number;
  e: Endpoints;
  t: Tenants;
  /** B's measurement window per case (and for the solo run). */
  windowMs: number;
  /** Mixes of `attacksPerCase`; or, with `single`, each attack of the pool alone, in a seeded order. */
  cases: number;
  attacksPerCase: number;
  single?: boolean;
  /** Which attacks may be picked (default: all but the documented open ones). */
  filter?: (a: Attack) => boolean;
  /** Stop starting cases after this. */
  deadlineMs?: number;
  print?: (line: string) => void;
}

function latency(v: VictimRun): Latency {
  return { writeP99: percentile(v.writeMs, 99), raiseP99: percentile(v.raiseMs, 99), writes: v.writeMs.length, raises: v.raiseMs.length };
}

/** B's data is exactly what B wrote in `run` (rows of its tag, its objects at its tokens) and its fence at B's token. */
async function bDataViolations(admin: pg.Pool, e: Endpoints, t: Tenants, tag: string, v: VictimRun): Promise<string[]> {
  const out: string[] = [];
  const rows = Number(
    (await admin.query<{ n: string }>(`SELECT count(*) AS n FROM ${t.b.table} WHERE starts_with(v, $1)`, [`${tag}:`])).rows[0]!.n,
  );
  if (rows !== v.sqlRows + v.txRows) out.push(`B's table has ${rows} rows of this run, B wrote ${v.sqlRows + v.txRows}`);
  const fence = (
    await admin.query<{ h: string }>('SELECT highest_token::text AS h FROM fencepost.fences WHERE fence_key = $1', [t.b.fenceKey])
  ).rows[0]?.h;
  if (fence !== String(v.token)) out.push(`B's fence is at ${fence}, B raised it to ${v.token}`);
  for (const [key, token] of v.objects) {
    const r = await http(e, t.b, 'GET', `/v1/objects/${encodeURIComponent(key)}`);
    if (r.status !== 200 || !r.text.startsWith(`${tag}:`)) out.push(`B's object ${key}: ${r.status} ${r.text.slice(0, 40)}`);
    void token;
  }
  return out;
}

async function endTenantA(admin: pg.Pool, t: Tenants): Promise<void> {
  for (let i = 0; i < 50; i++) {
    const pids = await tenantABackends(admin, t);
    if (pids.length === 0) return;
    await admin.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [pids]);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function runTenancy(o: TenancyOptions): Promise<TenancyReport> {
  const print = o.print ?? (() => {});
  const started = Date.now();
  const admin = new pg.Pool({ connectionString: o.e.adminUrl, max: 3 });
  admin.on('error', () => {});
  let attacker: AttackerProcess | null = null;
  try {
    const rng = new Prng(o.seed);
    const victimSeed = rng.int(0, 2 ** 31);
    let bToken = 100n;
    const aToken = 7n;
    let runs = 0;
    const victim = async () => {
      const tag = `r${o.seed}-${runs++}`;
      const v = await runVictim(o.e, o.t.b, { seed: victimSeed, durationMs: o.windowMs, startToken: bToken, runTag: tag });
      bToken = v.token;
      return { v, tag };
    };
    // Fence A's leader once (its fence, its epoch), and warm B's doors: neither is timed.
    await http(o.e, o.t.a, 'PUT', `/v1/fences/${encodeURIComponent(o.t.a.fenceKey)}`, { 'fencing-token': String(aToken) });
    await runVictim(o.e, o.t.b, { seed: victimSeed, durationMs: Math.min(500, o.windowMs), startToken: bToken, runTag: 'warm' }).then(
      (v) => (bToken = v.token),
    );

    const solo = await victim();
    const soloLat = latency(solo.v);
    const soloErrors = solo.v.errors.map((x) => `${x.op} ${x.code}`);
    if (soloErrors.length > 0) throw new Error(`B's solo run had errors, nothing to compare with: ${soloErrors.join(', ')}`);
    const bound = { writeMs: boundFor(soloLat.writeP99), raiseMs: boundFor(soloLat.raiseP99) };
    print(
      `tenancy: seed ${o.seed}; solo B: p99 write ${soloLat.writeP99.toFixed(0)} ms (${soloLat.writes}), raise ${soloLat.raiseP99.toFixed(0)} ms (${soloLat.raises}); bound write ${bound.writeMs.toFixed(0)} ms, raise ${bound.raiseMs.toFixed(0)} ms`,
    );

    // Targets are read after B's leader has run: its epoch sequence exists by now.
    const attacks = await allAttacks(admin, o.t);
    const pool = attacks.filter(o.filter ?? ((a) => !a.knownOpen));
    const order = o.single ? rng.shuffle(pool) : [];
    // A runs in a process of its own, started once the targets exist (it reads them too).
    const tenantA = new AttackerProcess(o.e, o.t);
    attacker = tenantA;
    const runCase = async (i: number, mix: Attack[]): Promise<CaseResult> => {
      // B alone again just before the case: the box's load drifts (other suites come and go), and
      // the case is held to the slower of the two solo runs.
      const before = await victim();
      if (before.v.errors.length > 0)
        throw new Error(`B's solo run before case ${i} had errors: ${before.v.errors.map((x) => `${x.op} ${x.code}`).join(', ')}`);
      const beforeLat = latency(before.v);
      const caseBound = {
        writeMs: Math.max(bound.writeMs, boundFor(beforeLat.writeP99)),
        raiseMs: Math.max(bound.raiseMs, boundFor(beforeLat.raiseP99)),
      };
      await tenantA.start(
        mix.map((a) => a.name),
        aToken,
        o.windowMs + 1000,
      );
      await new Promise((r) => setTimeout(r, 400)); // A's locks queued, its sessions open, before B starts
      const { v, tag } = await victim();
      const stopping = tenantA.stop();
      await endTenantA(admin, o.t);
      const byName = await stopping;
      const outcomes = mix.map((a) => byName[a.name] ?? { answers: { 'harness: no outcome': 1 }, longestRefusalMs: 0 });
      const b = latency(v);
      const bErrors = v.errors.map((x) => `${x.op} ${x.code}: ${x.message.slice(0, 120)}`);
      const violations = [
        ...(b.writeP99 > caseBound.writeMs ? [`B's p99 write ${b.writeP99.toFixed(0)} ms > bound ${caseBound.writeMs.toFixed(0)} ms`] : []),
        ...(b.raiseP99 > caseBound.raiseMs ? [`B's p99 raise ${b.raiseP99.toFixed(0)} ms > bound ${caseBound.raiseMs.toFixed(0)} ms`] : []),
        ...bErrors.map((x) => `B error: ${x}`),
        ...(await bDataViolations(admin, o.e, o.t, tag, v)),
      ];
      const result: CaseResult = {
        index: i,
        attacks: mix.map((a) => a.name),
        knownOpen: mix.some((a) => a.knownOpen),
        outcomes: Object.fromEntries(mix.map((a, j) => [a.name, outcomes[j]!])),
        b,
        bErrors,
        violations,
      };
      return result;
    };
    const cases: CaseResult[] = [];
    const total = o.single ? order.length : o.cases;
    for (let i = 0; i < total; i++) {
      if (o.deadlineMs !== undefined && Date.now() - started > o.deadlineMs) break;
      const mix = o.single ? [order[i]!] : pickMix(rng, pool, o.attacksPerCase);
      const first = await runCase(i, mix);
      // A latency bound missed with no B error and B's data intact: run the case once more. A
      // freeze is a lock wait that the same attack queues again (it comes back); a stall of the
      // box is not, and on a busy 2-core machine one late write out of a dozen is B's p99.
      const latencyOnly =
        first.violations.length > 0 && first.bErrors.length === 0 && first.violations.every((v) => v.startsWith("B's p99"));
      const result = latencyOnly ? { ...(await runCase(i, mix)), firstTry: first.violations } : first;
      cases.push(result);
      print(
        `  case ${i}${result.knownOpen ? ' (known open)' : ''}: ${result.attacks.join(' + ')}\n` +
          (result.firstTry ? `    first try: ${result.firstTry.join('; ')}; run again\n` : '') +
          `    B p99 write ${result.b.writeP99.toFixed(0)} ms (${result.b.writes}), raise ${result.b.raiseP99.toFixed(0)} ms (${result.b.raises}): ${result.violations.length === 0 ? 'within bound' : 'VIOLATION ' + result.violations.join('; ')}\n` +
          mix
            .map((a) => {
              const out = result.outcomes[a.name]!;
              return `    A ${a.name}: ${JSON.stringify(out.answers)}${out.longestRefusalMs > 200 ? ` (a refusal after ${out.longestRefusalMs.toFixed(0)} ms)` : ''}`;
            })
            .join('\n'),
      );
    }
    return {
      seed: o.seed,
      solo: soloLat,
      bound,
      soloTooSlow: soloLat.writeP99 > BOUND.slackMs,
      cases,
      attackCount: attacks.length,
      elapsedMs: Date.now() - started,
    };
  } finally {
    await attacker?.close();
    await admin.end();
  }
}
