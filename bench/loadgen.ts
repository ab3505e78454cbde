// Load generators that are C programs, not this Node process: `wrk` for HTTP against the proxy,
// `pgbench` for the same statement straight to Postgres. The bench process only writes their
// scripts, runs them and reads their figures, so it takes no CPU from what is measured while
// they run (on a small machine the load generator is a third party competing for the cores).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { distribution } from '../src/election/advice.ts';

/** A piece of Lua evaluated by wrk for every request (e.g. a random key), or a fixed string. */
export type LuaValue = string | { lua: string };

export interface WrkOptions {
  /** Base URL of the server, e.g. http://127.0.0.1:8080 */
  url: string;
  method: 'GET' | 'PUT' | 'POST' | 'DELETE';
  /** Request path; `{ lua }` is an expression evaluated per request, e.g. `"/v1/objects/k%2F" .. math.random(0, 4999)`. */
  path: LuaValue;
  headers?: Record<string, string>;
  body?: LuaValue;
  connections: number;
  threads?: number;
  durationS: number;
  /** A request slower than this counts as a timeout error (wrk's default is 2 s). */
  timeoutS?: number;
}

export interface WrkResult {
  rps: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  /** Responses outside 200…299 (counted by the script's response() callback). */
  non2xx: number;
  /** Status → count for the non-2xx responses, to explain them. */
  statuses: Record<string, number>;
  /** Socket errors: connect, read, write and timeouts. */
  errors: number;
}

export interface PgbenchOptions {
  /** postgres:// URL; passed as PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE. */
  url: string;
  /** pgbench script: `\set n random(0, 4999)` lines and SQL with `:n`. */
  scriptSql: string;
  clients: number;
  threads?: number;
  durationS: number;
  mode: 'prepared' | 'simple' | 'extended';
  /** Transactions per second to schedule (pgbench -R); default as fast as it goes. */
  rate?: number;
  /** More libpq environment, e.g. PGOPTIONS with the SQL endpoint's token and fence key. */
  env?: Record<string, string>;
}

export interface PgbenchResult {
  tps: number;
  p50Ms: number;
  p99Ms: number;
  transactions: number;
  /** Failed transactions (pgbench's count, and log lines without a latency). */
  failed: number;
}

/** A Lua string literal: printable ASCII as is, everything else as decimal byte escapes. */
export function luaString(s: string): string {
  let out = '"';
  for (const byte of Buffer.from(s, 'utf8')) {
    const c = String.fromCharCode(byte);
    if (c === '"' || c === '\\') out += '\\' + c;
    else if (byte >= 0x20 && byte < 0x7f) out += c;
    else out += `\\${byte}`;
  }
  return out + '"';
}

const lua = (v: LuaValue): string => (typeof v === 'string' ? luaString(v) : `(${v.lua})`);

/**
 * The wrk script: a request() built per request from `path`/`body`, a response() that counts
 * non-2xx by status in each thread, and a done() that sums the threads' counts (each wrk thread
 * has its own Lua state; done() reads them through the thread objects setup() kept).
 */
export function wrkScript(o: Pick<WrkOptions, 'method' | 'path' | 'headers' | 'body'>): string {
  const headers = Object.entries(o.headers ?? {})
    .map(([k, v]) => `[${luaString(k)}] = ${luaString(v)}`)
    .join(', ');
  return `-- written by bench/loadgen.ts
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_no", #threads)
end
function init(args)
  math.randomseed(os.time() * 100 + thread_no)
  non2xx = 0
  statuses = {}
end
local method = ${luaString(o.method)}
local headers = { ${headers} }
function request()
  return wrk.format(method, ${lua(o.path)}, headers, ${o.body === undefined ? 'nil' : lua(o.body)})
end
function response(status, hdrs, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    statuses[status] = (statuses[status] or 0) + 1
  end
end
function done(summary, latency, requests)
  local total, by = 0, {}
  for _, t in ipairs(threads) do
    total = total + t:get("non2xx")
    for status, n in pairs(t:get("statuses")) do by[status] = (by[status] or 0) + n end
  end
  io.write("fencepost-non2xx " .. total .. "\\n")
  for status, n in pairs(by) do io.write("fencepost-status " .. status .. " " .. n .. "\\n") end
end
`;
}

const UNIT_MS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000 };

/** "4.50ms" → 4.5 */
function wrkDurationMs(text: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(text);
  if (!m) throw new Error(`wrk: cannot read duration ${JSON.stringify(text)}`);
  return Number(m[1]) * UNIT_MS[m[2]!]!;
}

/** Figures from wrk's output (run with --latency and the script above). */
export function parseWrk(out: string): WrkResult {
  const need = (re: RegExp, what: string): RegExpExecArray => {
    const m = re.exec(out);
    if (!m) throw new Error(`wrk: no ${what} in its output:\n${out}`);
    return m;
  };
  const rps = Number(need(/^Requests\/sec:\s+([\d.]+)/m, 'Requests/sec')[1]);
  const requests = Number(need(/^\s*(\d+) requests in /m, 'request count')[1]);
  const dist = need(/Latency Distribution\n([\s\S]*?)\n\s*\d+ requests in/, 'latency distribution (--latency)')[1]!;
  const pct = (p: number): number => {
    const m = new RegExp(`^\\s*${p}%\\s+(\\S+)`, 'm').exec(dist);
    if (!m) throw new Error(`wrk: no ${p}% latency in its output:\n${out}`);
    return wrkDurationMs(m[1]!);
  };
  const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const errors = socket ? socket.slice(1, 5).reduce((s, n) => s + Number(n), 0) : 0;
  const statuses: Record<string, number> = {};
  for (const m of out.matchAll(/^fencepost-status (\d+) (\d+)$/gm)) statuses[m[1]!] = Number(m[2]);
  return {
    rps,
    p50Ms: pct(50),
    p99Ms: pct(99),
    requests,
    non2xx: Number(need(/^fencepost-non2xx (\d+)$/m, 'non-2xx count (script done())')[1]),
    statuses,
    errors,
  };
}

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], env?: NodeJS.ProcessEnv): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', (err) =>
      reject(new Error(`cannot run ${cmd} (npm run bench installs it: scripts/setup.sh --bench)`, { cause: err })),
    );
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** wrk against `url` for `durationS` with a Lua script written to a temporary file. */
export async function runWrk(o: WrkOptions): Promise<WrkResult> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-wrk-'));
  try {
    const script = join(dir, 'load.lua');
    writeFileSync(script, wrkScript(o));
    const threads = Math.min(o.threads ?? 2, o.connections);
    const args = [
      '-t',
      String(threads),
      '-c',
      String(o.connections),
      '-d',
      `${o.durationS}s`,
      '--timeout',
      `${o.timeoutS ?? 5}s`,
      '--latency',
      '-s',
      script,
      o.url,
    ];
    const r = await run('wrk', args);
    if (r.code !== 0) throw new Error(`wrk exited with ${r.code}: ${r.stderr}${r.stdout}`);
    return parseWrk(r.stdout);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** libpq's environment for a postgres:// URL. */
export function pgEnv(url: string): Record<string, string> {
  const u = new URL(url);
  return {
    PGHOST: u.hostname,
    PGPORT: u.port || '5432',
    PGUSER: decodeURIComponent(u.username),
    PGPASSWORD: decodeURIComponent(u.password),
    PGDATABASE: decodeURIComponent(u.pathname.replace(/^\//, '')),
    PGAPPNAME: 'fencepost-bench',
  };
}

/** Per-transaction latencies (µs, the log's third column) from pgbench's `-l` files. */
export function parsePgbenchLogs(texts: readonly string[]): { latenciesMs: number[]; failed: number } {
  const latenciesMs: number[] = [];
  let failed = 0;
  for (const text of texts) {
    for (const line of text.split('\n')) {
      if (line === '') continue;
      const f = line.split(' ');
      // A scheduled run (-R) logs the schedule lag after the time: the latency counts from the schedule.
      const us = Number(f[2]) + (f[6] === undefined ? 0 : Number(f[6]));
      if (Number.isFinite(us)) latenciesMs.push(us / 1000);
      else failed++; // "failed" (or "skipped") in place of a latency
    }
  }
  return { latenciesMs, failed };
}

/**
 * wrk's correction for coordinated omission (its stats_correct), applied to latencies of a closed
 * loop: `expectedMs` is the mean time between one connection's requests (run time × connections /
 * requests). A latency L of at least twice that stands for the requests a connection would have
 * sent meanwhile: samples at L − e, L − 2e, … while above e are added. wrk reports its percentiles
 * so; pgbench's per-transaction log is corrected the same way (runPgbench) for a p99 to compare with
 * wrk's. One stall of all connections then weighs as it would on an open loop: 300 ms in a 10 s run
 * at 32 connections is a p99 of about 190 ms, where uncorrected it is 32 samples among 500,000.
 */
export function correctCoordinatedOmission(latenciesMs: readonly number[], expectedMs: number): number[] {
  const out = [...latenciesMs];
  if (!(expectedMs > 0)) return out;
  for (const l of latenciesMs) {
    if (l < 2 * expectedMs) continue;
    for (let m = l - expectedMs; m > expectedMs; m -= expectedMs) out.push(m);
  }
  return out;
}

/**
 * `pgbench -n -M <mode> -c N -j T -T S -f script -l`; tps from its summary, p50/p99 from its log,
 * corrected for coordinated omission as wrk corrects its own (correctCoordinatedOmission).
 */
export async function runPgbench(o: PgbenchOptions): Promise<PgbenchResult> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-pgbench-'));
  try {
    const script = join(dir, 'script.sql');
    writeFileSync(script, o.scriptSql.endsWith('\n') ? o.scriptSql : o.scriptSql + '\n');
    const threads = Math.min(o.threads ?? 2, o.clients);
    const args = [
      '-n',
      '-M',
      o.mode,
      '-c',
      String(o.clients),
      '-j',
      String(threads),
      '-T',
      String(o.durationS),
      ...(o.rate === undefined ? [] : ['-R', String(o.rate)]),
      '-f',
      script,
      '-l',
      `--log-prefix=${join(dir, 'log')}`,
    ];
    const r = await run('pgbench', args, { ...process.env, ...pgEnv(o.url), ...o.env });
    const tps = /^tps = ([\d.]+)/m.exec(r.stdout);
    if (!tps) throw new Error(`pgbench exited with ${r.code}: ${r.stderr}${r.stdout}`);
    const logs = readdirSync(dir)
      .filter((f) => f.startsWith('log.'))
      .map((f) => readFileSync(join(dir, f), 'utf8'));
    const { latenciesMs, failed } = parsePgbenchLogs(logs);
    const reported = /^number of failed transactions: (\d+)/m.exec(r.stdout);
    // A scheduled run's latencies are measured from each transaction's scheduled start already.
    const expectedMs = latenciesMs.length > 0 && o.rate === undefined ? (o.durationS * 1000 * o.clients) / latenciesMs.length : 0;
    const d = distribution(correctCoordinatedOmission(latenciesMs, expectedMs));
    return {
      tps: Number(tps[1]),
      p50Ms: d.median,
      p99Ms: d.p99,
      transactions: latenciesMs.length,
      failed: Math.max(failed, Number(reported?.[1] ?? 0)),
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** "wrk 4.1.0-3+b2, pgbench 15.18" for the report. */
export function loadGeneratorVersions(): { wrk: string; pgbench: string } {
  const version = (cmd: string, re: RegExp): string => {
    const r = spawnSync(cmd, ['--version'], { encoding: 'utf8' });
    const m = re.exec(`${r.stdout ?? ''}${r.stderr ?? ''}`);
    return m?.[1] ?? 'not installed';
  };
  return { wrk: version('wrk', /^wrk (?:debian\/)?(\S+)/m), pgbench: version('pgbench', /^pgbench \(PostgreSQL\) (\S+)/m) };
}
