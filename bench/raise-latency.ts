// Bounded handover (src/fence/raise.ts): how long a new leader's raise takes with each kind of
// holder at the old token on its fence, and whether anything of the old token commits after it.
// One fresh Postgres (max_prepared_transactions and track_commit_timestamp on), one `fencepost
// serve` with the SQL endpoint and default settings (FENCEPOST_RAISE_WAIT_MS, the lock timeout).
// Each round has a fence key of its own, raised to token 1 first; the holder takes it at token 1;
// the raise to token 2 is timed from request to answer; then the holder is resumed or woken and
// tries to commit; Postgres says what of token 1 landed.
//
//   holders   writers   32 HTTP object writers (PUT /v1/objects, Fence-Key, one new object per
//                       write) writing continuously at token 1 before, during and 300 ms after the raise
//             idle      an SQL endpoint session (node-postgres) left idle inside BEGIN, its row inserted
//             sigstop   a psycopg2 process (bench/handover-writer.py) inside BEGIN…COMMIT through the
//                       SQL endpoint, SIGSTOPped after its INSERT, SIGCONTed after the raise's answer
//             sleeper   POST /v1/transactions that inserts, lifts its statement timeout
//                       (`;SET LOCAL statement_timeout = 0`) and runs `SELECT pg_sleep(25)`
//             zombies   32 pooled SQL endpoint sessions (node-postgres) at token 1 running overlapping
//                       BEGIN; INSERT; pg_sleep(0.2); COMMIT back to back, reconnecting when ended,
//                       before, during and 300 ms after the raise
//             prepared  a prepared transaction made straight on Postgres as the owner (FOR SHARE on
//                       the fence row, an insert, PREPARE TRANSACTION), COMMIT PREPARED tried after
//   doors     put       PUT /v1/fences at token 2 (its own statement waits the lock timeout, then the raise)
//             sql       a new SQL endpoint session at token 2 (its connect raises the fence) and its
//                       first write (an autocommit INSERT), timed from the connect
//
// Older-token commits after the raise: rows of token 1 on the round's fence whose commit timestamp
// is after the raise's own (the fence row's xmin), counted in Postgres. A held holder is resumed
// only after the raise's answer, so any row of it is one; the writers' rows are new objects.
//
// `node --import tsx bench/raise-latency.ts [writers|idle|sigstop|sleeper|prepared|put|sql…]` runs some
// holders and doors (default all), BENCH_RAISE_ROUNDS rounds each (default 20), and prints the table.
import { spawn } from 'node:child_process';
import http from 'node:http';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { loadConfig } from '../src/proxy/config.ts';
import { distribution, type Distribution } from '../src/election/advice.ts';
import { spawnServe, type ServeProcess } from './serve.ts';
import { benchPostgres, fmt, machine, FSYNC_STALL_MS, watchWalSync, type WalSyncWatch } from './support.ts';

export const HOLDERS = ['writers', 'zombies', 'idle', 'sigstop', 'sleeper', 'prepared'] as const;
export type HolderKind = (typeof HOLDERS)[number];
export const DOORS = ['put', 'sql'] as const;
export type Door = (typeof DOORS)[number];

export interface HandoverBenchOptions {
  /** Rounds per holder and door. */
  rounds: number;
  holders?: readonly HolderKind[];
  doors?: readonly Door[];
  log?: (line: string) => void;
}

export interface HandoverRow {
  holder: HolderKind;
  door: Door;
  /** Raise latency, request to answer (ms), over the rounds. */
  raiseMs: Distribution;
  /** Raise answers other than success, by answer (HTTP status or SQLSTATE). */
  failed: Record<string, number>;
  /** Token-1 rows on the round's fence committed after the raise committed, over all rounds. Must be 0. */
  olderCommits: number;
  /** What the holder heard when it tried to commit after the raise, by answer, over all rounds. */
  heard: Record<string, number>;
  /** Rounds whose raise took longer than the goal; of them, rounds in which a WAL fsync took ≥ FSYNC_STALL_MS (watchWalSync). */
  overGoal: number;
  overGoalDisk: number;
  /** Why the row did not run. */
  skipped?: string;
}

export interface HandoverReport {
  raiseWaitMs: number;
  lockTimeoutMs: number;
  rounds: number;
  /** Older-token commits counted by commit timestamp (track_commit_timestamp on), else as olderCommitsAfterRaise says. */
  commitTimestamps: boolean;
  rows: HandoverRow[];
}

/** The goal of every row: the raise wait + 200 ms. */
export const goalMs = (r: Pick<HandoverReport, 'raiseWaitMs'>) => r.raiseWaitMs + 200;

const HOLDER_NAMES: Record<HolderKind, string> = {
  writers: '32 HTTP object writers in flight',
  zombies: '32 busy pooled SQL sessions, reconnecting',
  idle: 'idle SQL endpoint transaction (node-postgres)',
  sigstop: 'SIGSTOPped psycopg2 writer inside BEGIN…COMMIT',
  sleeper: 'sleeping /v1/transactions (statement timeout lifted, pg_sleep(25))',
  prepared: 'prepared transaction (owner, FOR SHARE)',
};
const DOOR_NAMES: Record<Door, string> = { put: 'PUT /v1/fences', sql: 'SQL endpoint, first write' };

const WRITERS = 32;
/** How long the writers keep writing after the raise's answer (their token-1 writes must all fail). */
const WRITERS_AFTER_MS = 300;
const PSYCOPG2_WRITER = join(import.meta.dirname, 'handover-writer.py');
const PYTHON = process.env.BENCH_PYTHON ?? '/usr/bin/python3';

interface World {
  /** WAL fsyncs seen in Postgres, per round. */
  wal: WalSyncWatch;
  /** The raise's bound: goalMs(). */
  goalMs: number;
  owner: pg.Pool;
  proxy: ServeProcess;
  dbUrl: string;
  /** The SQL endpoint's URL for login `user` (open mode: no password). */
  endpointUrl(user: string): string;
  /** Commit timestamps are on: older-token commits are counted by them. */
  commitTimestamps: boolean;
  agent: http.Agent;
}

/** The holder at token 1, holding the round's fence; `resume` wakes it after the raise: what it heard. */
interface Holder {
  resume(): Promise<string[]>;
  /** Whatever is left of it (also after a failure). */
  dispose(): Promise<void>;
}

interface Answer {
  status: number;
  text: string;
}

function request(agent: http.Agent, url: string, method: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  return new Promise((resolve) => {
    const req = http.request(
      url,
      { method, headers: body === undefined ? headers : { ...headers, 'content-length': String(Buffer.byteLength(body)) }, agent },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.once('end', () => resolve({ status: res.statusCode ?? 0, text }));
        res.once('error', () => resolve({ status: 0, text }));
      },
    );
    req.once('error', (e) => resolve({ status: 0, text: e.message }));
    req.end(body);
  });
}

/** `-c fencepost.token=… -c fencepost.fence_key=…`, as a session's startup options. */
function fenceOptions(token: number, fenceKey: string): string {
  return `-c fencepost.token=${token} -c fencepost.fence_key=${fenceKey.replace(/[\\\s]/g, (c) => `\\${c}`)}`;
}

/** An SQL endpoint session at `token` on `fenceKey`, connected. */
async function endpointSession(w: World, user: string, token: number, fenceKey: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: w.endpointUrl(user), options: fenceOptions(token, fenceKey) });
  c.on('error', () => {}); // a session the raise ended: its next query says how
  await c.connect();
  return c;
}

const answerOf = (e: unknown) => (e as { code?: string }).code ?? (e instanceof Error ? e.message.slice(0, 40) : String(e));

async function until(what: () => Promise<boolean>, timeoutMs: number, label: string): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await what())) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${label}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const insertRow = (who: string) => `INSERT INTO app.ho_rows (fence_key, token, who) VALUES ($1, $2, '${who}')`;

// ---- the holders ---------------------------------------------------------------------------------

async function writersHolder(w: World, fenceKey: string): Promise<Holder> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: WRITERS });
  const headers = { 'content-type': 'application/json', 'fence-key': fenceKey, 'fencing-token': '1' };
  let stopAt = Infinity;
  let raisedAt = Infinity;
  const after: Record<string, number> = {};
  let acked = 0;
  const loop = async (i: number) => {
    for (let n = 0; performance.now() < stopAt; n++) {
      const sent = performance.now();
      const r = await request(
        agent,
        `${w.proxy.url}/v1/objects/${encodeURIComponent(`${fenceKey}/w${i}/${n}`)}`,
        'PUT',
        headers,
        '{"v":1}',
      );
      acked++;
      if (sent > raisedAt) after[r.status] = (after[r.status] ?? 0) + 1;
    }
  };
  const loops = Promise.all(Array.from({ length: WRITERS }, (_, i) => loop(i)));
  // In flight: every writer has had a write answered, and they keep going.
  await until(async () => acked >= 2 * WRITERS, 10_000, 'the writers');
  return {
    resume: async () => {
      raisedAt = performance.now();
      await new Promise((r) => setTimeout(r, WRITERS_AFTER_MS));
      stopAt = 0;
      await loops;
      return Object.entries(after).map(([s, n]) => `${s === '0' ? 'no answer' : s}×${n}`);
    },
    dispose: async () => {
      stopAt = 0;
      await loops;
      agent.destroy();
    },
  };
}

async function zombiesHolder(w: World, fenceKey: string): Promise<Holder> {
  let stopAt = Infinity;
  let raisedAt = Infinity;
  const after: Record<string, number> = {};
  let committed = 0;
  const loop = async (i: number) => {
    while (performance.now() < stopAt) {
      let c: pg.Client | null = null;
      try {
        c = await endpointSession(w, `ho-zombie-${i % 4}`, 1, fenceKey);
        while (performance.now() < stopAt) {
          const sent = performance.now();
          const answer = await (async () => {
            await c!.query('BEGIN');
            await c!.query(insertRow('zombie'), [fenceKey, 1]);
            await c!.query('SELECT pg_sleep(0.2)');
            await c!.query('COMMIT');
            committed++;
            return 'committed';
          })().catch(answerOf);
          if (sent > raisedAt) after[answer] = (after[answer] ?? 0) + 1;
          if (answer !== 'committed') break;
        }
      } catch (e) {
        if (performance.now() > raisedAt) after[answerOf(e)] = (after[answerOf(e)] ?? 0) + 1;
      } finally {
        await c?.end().catch(() => {});
      }
    }
  };
  const loops = Promise.all(Array.from({ length: WRITERS }, (_, i) => loop(i)));
  // Busy: every session has committed, and they keep going.
  await until(async () => committed >= WRITERS, 20_000, 'the busy zombies');
  return {
    resume: async () => {
      raisedAt = performance.now();
      await new Promise((r) => setTimeout(r, WRITERS_AFTER_MS));
      stopAt = 0;
      await loops;
      return Object.entries(after).map(([s, n]) => `${s}×${n}`);
    },
    dispose: async () => {
      stopAt = 0;
      await loops;
    },
  };
}

async function idleHolder(w: World, fenceKey: string): Promise<Holder> {
  const c = await endpointSession(w, 'ho-idle', 1, fenceKey);
  await c.query('BEGIN');
  await c.query(insertRow('idle'), [fenceKey, 1]);
  return {
    resume: async () => [await c.query('COMMIT').then(() => 'committed', answerOf)],
    dispose: () => c.end().catch(() => {}),
  };
}

async function sigstopHolder(w: World, fenceKey: string): Promise<Holder> {
  const child = spawn(PYTHON, [PSYCOPG2_WRITER, w.endpointUrl('ho-psycopg2'), fenceKey, '1'], {
    env: { ...process.env, PGOPTIONS: fenceOptions(1, fenceKey) },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async () => {
    const l = await lines.next();
    if (l.done) throw new Error(`psycopg2 writer exited: ${stderr.trim()}`);
    return l.value;
  };
  const ready = await next();
  if (ready !== 'ready') throw new Error(`psycopg2 writer said ${ready}: ${stderr.trim()}`);
  child.kill('SIGSTOP');
  return {
    resume: async () => {
      child.kill('SIGCONT');
      child.stdin.write('commit\n');
      const said = await next();
      await exited;
      return [said.replace(/^error /, '')];
    },
    dispose: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGCONT');
        child.kill('SIGKILL');
        await exited;
      }
    },
  };
}

async function sleeperHolder(w: World, fenceKey: string): Promise<Holder> {
  const body = JSON.stringify({
    fences: [{ key: fenceKey, token: '1' }],
    statements: [
      { sql: insertRow('sleeper'), params: [fenceKey, 1] },
      { sql: ';SET LOCAL statement_timeout = 0' },
      { sql: 'SELECT pg_sleep(25)' },
    ],
  });
  const answer = request(w.agent, `${w.proxy.url}/v1/transactions`, 'POST', { 'content-type': 'application/json' }, body);
  // Asleep inside its transaction, its row inserted (the earlier rounds' sleepers were ended).
  await until(
    async () =>
      (await w.owner.query(`SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(25)' AND state = 'active'`)).rowCount === 1,
    10_000,
    'the sleeper',
  );
  return {
    resume: async () => {
      const a = await answer;
      const code = /"error":"([^"]+)"/.exec(a.text)?.[1];
      return [`${a.status}${code ? ` ${code}` : ''}`];
    },
    dispose: async () => {
      await w.owner.query(
        `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(25)' AND state = 'active'`,
      );
      await answer;
    },
  };
}

async function preparedHolder(w: World, fenceKey: string): Promise<Holder> {
  const gid = `ho-${fenceKey}`;
  const c = new pg.Client({ connectionString: w.dbUrl });
  await c.connect();
  try {
    await c.query('BEGIN');
    await c.query('SELECT 1 FROM fencepost.fences WHERE fence_key = $1 FOR SHARE', [fenceKey]);
    await c.query(insertRow('prepared'), [fenceKey, 1]);
    await c.query(`PREPARE TRANSACTION ${pg.escapeLiteral(gid)}`);
  } finally {
    await c.end();
  }
  return {
    resume: async () => [await w.owner.query(`COMMIT PREPARED ${pg.escapeLiteral(gid)}`).then(() => 'committed', answerOf)],
    dispose: async () => {
      await w.owner.query(`ROLLBACK PREPARED ${pg.escapeLiteral(gid)}`).catch(() => {});
    },
  };
}

const MAKE_HOLDER: Record<HolderKind, (w: World, fenceKey: string) => Promise<Holder>> = {
  writers: writersHolder,
  zombies: zombiesHolder,
  idle: idleHolder,
  sigstop: sigstopHolder,
  sleeper: sleeperHolder,
  prepared: preparedHolder,
};

// ---- the raise -----------------------------------------------------------------------------------

interface Raised {
  ms: number;
  /** null: it went through (200; the SQL write committed). Else the HTTP status or SQLSTATE. */
  failure: string | null;
}

/** What the raise's door needs before the clock starts (a connection), and the timed raise. */
async function prepareRaise(w: World, door: Door, fenceKey: string): Promise<{ raise(): Promise<Raised>; dispose(): Promise<void> }> {
  if (door === 'put') {
    return {
      raise: async () => {
        const t = performance.now();
        const a = await request(w.agent, `${w.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, 'PUT', { 'fencing-token': '2' });
        return { ms: performance.now() - t, failure: a.status === 200 ? null : String(a.status) };
      },
      dispose: async () => {},
    };
  }
  // A connection is fenced (and its fence raised) as it is made: the clock runs from the connect
  // to its first write's answer.
  let c: pg.Client | null = null;
  return {
    raise: async () => {
      const t = performance.now();
      const failure = await endpointSession(w, 'ho-leader', 2, fenceKey).then((session) => {
        c = session;
        return session.query(insertRow('leader'), [fenceKey, 2]).then(() => null, answerOf);
      }, answerOf);
      return { ms: performance.now() - t, failure };
    },
    dispose: async () => {
      await (c as pg.Client | null)?.end().catch(() => {});
    },
  };
}

// ---- one row: rounds of one holder and one door --------------------------------------------------

async function runRow(w: World, holder: HolderKind, door: Door, rounds: number, log: (line: string) => void): Promise<HandoverRow> {
  const ms: number[] = [];
  const failed: Record<string, number> = {};
  const heard: Record<string, number> = {};
  let olderCommits = 0;
  let overGoal = 0;
  let overGoalDisk = 0;
  for (let i = 0; i < rounds; i++) {
    const fenceKey = `ho/${holder}/${door}/${i}`;
    const up = await request(w.agent, `${w.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, 'PUT', { 'fencing-token': '1' });
    if (up.status !== 200) throw new Error(`PUT /v1/fences/${fenceKey} at token 1 answered ${up.status}: ${up.text}`);
    // The holder first, then the new leader's connection (a session at token 2 raises nothing
    // until its first transaction): the clock runs from the raise's request only.
    const h = await MAKE_HOLDER[holder](w, fenceKey);
    let raiser: Awaited<ReturnType<typeof prepareRaise>> | null = null;
    let acceptedAfter = 0;
    try {
      raiser = await prepareRaise(w, door, fenceKey);
      w.wal.mark();
      const r = await raiser.raise();
      ms.push(r.ms);
      if (r.ms > w.goalMs) {
        overGoal++;
        if (w.wal.longestMs() >= FSYNC_STALL_MS) overGoalDisk++;
      }
      if (r.failure !== null) failed[r.failure] = (failed[r.failure] ?? 0) + 1;
      for (const said of await h.resume()) {
        const [what = said, n = '1'] = said.split('×');
        heard[what] = (heard[what] ?? 0) + Number(n);
        if ((holder === 'writers' && what === '200') || (holder === 'zombies' && what === 'committed')) acceptedAfter += Number(n);
      }
    } finally {
      await h.dispose();
      await raiser?.dispose();
    }
    olderCommits +=
      w.commitTimestamps || (holder !== 'writers' && holder !== 'zombies')
        ? await olderCommitsAfterRaise(w, holder, fenceKey)
        : acceptedAfter;
  }
  const d = distribution(ms);
  log(`${holder} / ${door}: p50 ${fmt(d.median, 0)} ms, p99 ${fmt(d.p99, 0)} ms, older-token commits after the raise ${olderCommits}`);
  return { holder, door, raiseMs: d, failed, olderCommits, heard, overGoal, overGoalDisk };
}

/**
 * Token-1 rows of the round's fence that committed after the raise did (the fence row's xmin is
 * the raise: nothing else updates it in a round). Without commit timestamps (a DATABASE_URL server
 * with track_commit_timestamp off): a held holder's rows, all of them (it was resumed after the
 * raise's answer); the writers' are counted from their answers instead (runRow).
 */
async function olderCommitsAfterRaise(w: World, holder: HolderKind, fenceKey: string): Promise<number> {
  const rows = holder === 'writers' ? 'fencepost.objects' : 'app.ho_rows';
  if (!w.commitTimestamps) {
    const { rows: r } = await w.owner.query<{ n: string }>('SELECT count(*) AS n FROM app.ho_rows WHERE fence_key = $1 AND token = 1', [
      fenceKey,
    ]);
    return Number(r[0]!.n);
  }
  const { rows: r } = await w.owner.query<{ n: string }>(
    `SELECT count(*) AS n FROM ${rows} o, fencepost.fences f
     WHERE f.fence_key = $1 AND o.fence_key = $1 AND o.token = 1
       AND pg_xact_commit_timestamp(o.xmin) > pg_xact_commit_timestamp(f.xmin)`,
    [fenceKey],
  );
  return Number(r[0]!.n);
}

// ---- the world and the report --------------------------------------------------------------------

export async function runRaiseLatencyBench(options: HandoverBenchOptions): Promise<HandoverReport> {
  const o = { holders: HOLDERS, doors: DOORS, log: () => {}, ...options };
  const db = await benchPostgres('fencepost_bench_handover', {
    postgresFlags: ['-c', 'max_prepared_transactions=10', '-c', 'track_commit_timestamp=on'],
  });
  const clientRole = `fpbench_handover_${process.pid}`;
  const owner = new pg.Pool({ connectionString: db.url, max: 4 });
  owner.on('error', () => {});
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
  let proxy: ServeProcess | null = null;
  let wal: WalSyncWatch | null = null;
  try {
    await migrate(owner);
    wal = await watchWalSync(db.url);
    await owner.query('CREATE SCHEMA app');
    await owner.query(
      'CREATE TABLE app.ho_rows (id bigserial PRIMARY KEY, fence_key text NOT NULL, token bigint NOT NULL, who text NOT NULL)',
    );
    const env = { DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRole, FENCEPOST_PGWIRE_MAX_CONNECTIONS: '200', ...extraEnv() };
    // The settings the proxy runs with, read by its own config module from the same environment.
    const config = loadConfig({ ...process.env, ...env, PORT: '0', FENCEPOST_PGWIRE_PORT: '0' });
    proxy = await spawnServe(env, 'strict', { pgwire: true });
    const pgwirePort = proxy.pgwirePort!;
    const role = pg.escapeIdentifier(clientRole);
    await owner.query(`GRANT USAGE ON SCHEMA app TO ${role}`);
    await owner.query(`GRANT SELECT, INSERT ON app.ho_rows TO ${role}`);
    await owner.query(`GRANT USAGE ON SEQUENCE app.ho_rows_id_seq TO ${role}`);
    const setting = async (name: string) => (await owner.query<{ v: string }>(`SELECT current_setting('${name}') AS v`)).rows[0]!.v;
    const preparedSlots = Number(await setting('max_prepared_transactions'));
    const w: World = {
      wal,
      goalMs: goalMs(config),
      owner,
      proxy,
      dbUrl: db.url,
      agent,
      commitTimestamps: (await setting('track_commit_timestamp')) === 'on',
      endpointUrl: (user) => {
        const u = new URL(db.url);
        u.username = user;
        u.password = '';
        u.port = String(pgwirePort);
        return u.toString();
      },
    };
    const report: HandoverReport = {
      raiseWaitMs: config.raiseWaitMs,
      lockTimeoutMs: config.lockTimeoutMs,
      rounds: o.rounds,
      commitTimestamps: w.commitTimestamps,
      rows: [],
    };
    o.log(
      `handover: FENCEPOST_RAISE_WAIT_MS=${config.raiseWaitMs}, FENCEPOST_LOCK_TIMEOUT_MS=${config.lockTimeoutMs}; ${o.rounds} rounds per holder and door`,
    );
    for (const holder of o.holders) {
      for (const door of o.doors) {
        if (holder === 'prepared' && preparedSlots === 0) {
          report.rows.push({
            holder,
            door,
            raiseMs: distribution([]),
            failed: {},
            olderCommits: 0,
            heard: {},
            overGoal: 0,
            overGoalDisk: 0,
            skipped: 'max_prepared_transactions = 0 on the DATABASE_URL server',
          });
          continue;
        }
        report.rows.push(await runRow(w, holder, door, o.rounds, o.log));
      }
    }
    return report;
  } finally {
    agent.destroy();
    await wal?.stop();
    await proxy?.stop();
    await owner.end();
    await db.stop();
  }
}

const met = (ok: boolean) => (ok ? 'yes' : '**no**');
const counts = (c: Record<string, number>) =>
  Object.entries(c)
    .map(([k, n]) => `${k} ×${n}`)
    .join(', ');

export function raiseLatencyTable(r: HandoverReport): string {
  const goal = goalMs(r);
  const out = [
    `Bounded handover (bench/raise-latency.ts): FENCEPOST_RAISE_WAIT_MS = ${r.raiseWaitMs}, FENCEPOST_LOCK_TIMEOUT_MS = ${r.lockTimeoutMs} (defaults unless BENCH_PROXY_ENV); ${r.rounds} rounds per row, a fence key per round, raise from token 1 to 2 timed from request to answer; ${r.commitTimestamps ? "older-token commits: token-1 rows of the round's fence committed after the raise, by commit timestamp in Postgres" : "older-token commits (track_commit_timestamp off): the held holders' rows in Postgres, the writers' 200s to writes sent after the raise's answer"}. The writers' "heard" is their writes sent after the raise's answer, by status.`,
    '',
    `| holder at the old token | raise door | rounds | p50 ms | p99 ms | max ms | goal (raise wait + 200) | met? | rounds over the goal: all / with a WAL fsync ≥ ${FSYNC_STALL_MS} ms | raise failures | older-token commits after the raise | what the holder heard after the raise |`,
    '|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|',
  ];
  for (const x of r.rows) {
    if (x.skipped) {
      out.push(`| ${HOLDER_NAMES[x.holder]} | ${DOOR_NAMES[x.door]} | 0 | – | – | – | ≤ ${goal} | skipped: ${x.skipped} | | | | |`);
      continue;
    }
    const failures = Object.values(x.failed).reduce((a, b) => a + b, 0);
    const ok = x.raiseMs.p99 <= goal && failures === 0 && x.olderCommits === 0;
    out.push(
      `| ${HOLDER_NAMES[x.holder]} | ${DOOR_NAMES[x.door]} | ${x.raiseMs.samples} | ${fmt(x.raiseMs.median, 0)} | ${fmt(x.raiseMs.p99, 0)} | ${fmt(x.raiseMs.max, 0)} | ≤ ${goal} | ${met(ok)} | ${x.overGoal} / ${x.overGoalDisk} | ${failures === 0 ? 0 : `${failures} (${counts(x.failed)})`} | ${x.olderCommits} | ${counts(x.heard)} |`,
    );
  }
  return out.join('\n');
}

/** BENCH_PROXY_ENV='{"FENCEPOST_RAISE_WAIT_MS":"500"}' tries settings without editing code. */
function extraEnv(): Record<string, string> {
  return process.env.BENCH_PROXY_ENV ? (JSON.parse(process.env.BENCH_PROXY_ENV) as Record<string, string>) : {};
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const asked = process.argv.slice(2);
  const unknown = asked.filter((a) => !(HOLDERS as readonly string[]).includes(a) && !(DOORS as readonly string[]).includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`unknown holder or door ${unknown.join(', ')}; choose from ${[...HOLDERS, ...DOORS].join(', ')}\n`);
    process.exit(2);
  }
  const holders = HOLDERS.filter((h) => asked.includes(h));
  const doors = DOORS.filter((d) => asked.includes(d));
  const report = await runRaiseLatencyBench({
    rounds: Number(process.env.BENCH_RAISE_ROUNDS ?? 20),
    holders: holders.length > 0 ? holders : HOLDERS,
    doors: doors.length > 0 ? doors : DOORS,
    log: (line) => process.stderr.write(`[bench] ${line}\n`),
  });
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${raiseLatencyTable(report)}\n`);
}
