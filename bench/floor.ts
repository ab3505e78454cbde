// The runtime's floor: what Node costs per operation on this machine with no fencepost logic at
// all, under the load of the proxy's own scenarios (bench/floor-servers.ts). Issue 26 sets the
// proxy's CPU per operation; these rows say how much of any figure is the runtime's before the
// proxy does anything.
//   HTTP: node:http and a bare fastify route, each under the one-fence-key wrk load (PUT, 32
//   connections, the same headers and 256-byte JSON body as bench/fence-key.ts), no database.
//   SQL: a Node TCP relay between pgbench and Postgres is bench/sql-endpoint.ts's path `relay`.
// Every process on every core (without Postgres, pinning would only put the server and wrk on
// one core together).
//
// `node --import tsx bench/floor.ts` runs the HTTP rows alone (BENCH_DURATION_S).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { exitedChildrenProbe, measureCpu, treeProbe, type CpuWindow } from './cpu.ts';
import { loadGeneratorVersions, runWrk, type WrkResult } from './loadgen.ts';
import { fmt, jsonBody, machine } from './support.ts';

const SERVERS = join(import.meta.dirname, 'floor-servers.ts');

export interface FloorServer {
  pid: number;
  port: number;
  stop(): Promise<void>;
}

/** A server of bench/floor-servers.ts as a process of its own, once it listens (on a free port, of FENCEPOST_PORT_RANGE when set). */
export async function startFloorServer(kind: 'relay' | 'http' | 'fastify', args: readonly string[] = []): Promise<FloorServer> {
  const child = spawn(process.execPath, ['--import', 'tsx', SERVERS, kind, '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  let out = '';
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`floor server ${kind} not ready in 30 s: ${err}`)), 30_000);
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const ready = /^ready (\d+)$/m.exec(out);
      if (ready) {
        clearTimeout(timer);
        resolve(Number(ready[1]));
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`floor server ${kind} exited with ${code}: ${err}`));
    });
  });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  return {
    pid: child.pid!,
    port,
    stop: async () => {
      child.kill('SIGTERM');
      await exited;
    },
  };
}

export interface HttpFloorRow {
  server: 'http' | 'fastify';
  result: WrkResult;
  cpu: CpuWindow;
}

const SERVER_NAMES: Record<HttpFloorRow['server'], string> = {
  http: '`node:http`: read the body, answer 200 with a small JSON body',
  fastify: 'fastify 5, one PUT route: JSON body parsed, JSON reply',
};

/** Issue 26's proxy CPU goal per HTTP object write (bench/fence-key.ts). */
const HTTP_PROXY_GOAL_US = 35;

export async function runHttpFloorBench(o: { durationS: number; warmupS?: number; log?: (line: string) => void }): Promise<HttpFloorRow[]> {
  const warmupS = o.warmupS ?? 1;
  const rows: HttpFloorRow[] = [];
  for (const server of ['http', 'fastify'] as const) {
    const s = await startFloorServer(server);
    try {
      const wrk = {
        url: `http://127.0.0.1:${s.port}`,
        method: 'PUT' as const,
        path: { lua: '"/v1/objects/bench%2F" .. math.random(0, 4999)' },
        headers: { 'Content-Type': 'application/json', 'Fence-Key': 'bench', 'Fencing-Token': '1' },
        body: jsonBody(256),
        connections: 32,
      };
      o.log?.(`floor: ${server}, wrk 32 connections, ${o.durationS} s`);
      if (warmupS > 0) await runWrk({ ...wrk, durationS: warmupS });
      const { result, cpu } = await measureCpu([treeProbe('proxy', s.pid), exitedChildrenProbe()], () =>
        runWrk({ ...wrk, durationS: o.durationS }),
      );
      rows.push({ server, result, cpu });
    } finally {
      await s.stop();
    }
  }
  return rows;
}

export function httpFloorTable(rows: readonly HttpFloorRow[], durationS: number): string {
  if (rows.length === 0) return '';
  const v = loadGeneratorVersions();
  const out = [
    `The runtime's floor, HTTP: a Node server with no fencepost logic and no database, under the one-fence-key load (wrk ${v.wrk}, 2 threads, 32 connections, PUT /v1/objects/… with a 256-byte JSON body), ${durationS} s after 1 s of warm-up, every process on every core. CPU per request of the server process (and the cores it kept busy) and of wrk, from /proc over the measured seconds. Issue 26's goal for the proxy is ≤ ${HTTP_PROXY_GOAL_US} µs per fenced write.`,
    '',
    '| server | req/s | p50 / p99 ms | server µs/req | ≤ 35 µs | wrk µs/req | non-2xx |',
    '|---|---:|---:|---:|---|---:|---:|',
  ];
  for (const r of rows) {
    const x = r.result;
    const server = r.cpu.us.proxy === undefined || x.requests === 0 ? undefined : r.cpu.us.proxy / x.requests;
    const wrk = r.cpu.us.loadgen === undefined || x.requests === 0 ? undefined : r.cpu.us.loadgen / x.requests;
    const cores = r.cpu.us.proxy === undefined ? '' : ` (${fmt(r.cpu.us.proxy / 1e6 / r.cpu.seconds, 2)})`;
    out.push(
      `| ${SERVER_NAMES[r.server]} | ${fmt(x.rps, 0)} | ${fmt(x.p50Ms, 2)} / ${fmt(x.p99Ms, 2)} | ${server === undefined ? '–' : fmt(server, 1)}${cores} | ${server === undefined ? '–' : server <= HTTP_PROXY_GOAL_US ? 'yes' : '**no**'} | ${wrk === undefined ? '–' : fmt(wrk, 1)} | ${x.non2xx + x.errors} |`,
    );
  }
  return out.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const durationS = Number(process.env.BENCH_DURATION_S ?? 10);
  const rows = await runHttpFloorBench({ durationS, log: (line) => process.stderr.write(`[bench] ${line}\n`) });
  process.stdout.write(`Measured on: ${machine()}; ${new Date().toISOString().slice(0, 10)}.\n\n${httpFloorTable(rows, durationS)}\n`);
}
