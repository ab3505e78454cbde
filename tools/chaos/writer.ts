// One chaos writer process (`fencepost chaos-writer`, spawned by the chaos run): for each fence key
// it runs its own election and FencedWriter, and while leader writes every interval, alternating a
// PUT of a fresh key (`<fenceKey>/<writer>/<n>`, checkable at the end) and a PUT of the fence key's
// ledger (`<fenceKey>/ledger`, whose version numbers give the commit order). Each write does a
// little synchronous "work" between taking the token and sending: the window where a pause turns a
// leader into a zombie. Every request goes into the history; leadership changes go to stdout as
// JSON lines for the nemesis, which aims at leaders. `--door` says how the writes go: `http` (PUT),
// `tx` (POST /v1/transactions) or `sql` (the proxies' SQL endpoints, `--pgwire`, node-postgres);
// every door writes the same rows of fencepost.objects, and fence advances are HTTP.
import { parseArgs } from 'node:util';
import { Election } from '../../src/election/index.ts';
import { FencedWriter } from '../../src/writer/index.ts';
import { DOORS, HistoryRecorder, type Door } from './history.ts';
import { RecordingProxyClient } from './recording-client.ts';

export interface WriterEvent {
  t: number;
  writer: string;
  event: 'started' | 'ready' | 'revoked' | 'stepped-down' | 'write-begin' | 'stopped';
  fenceKey?: string;
  token?: string;
}

export const ledgerKey = (fenceKey: string): string => `${fenceKey}/ledger`;

/** How long a writer honours a mid-write pause request (the nemesis waits a little longer). */
export const PAUSE_REQUEST_MS = 800;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function chaosWriterCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      id: { type: 'string' },
      zk: { type: 'string' },
      proxies: { type: 'string' },
      'fence-keys': { type: 'string' },
      'election-root': { type: 'string' },
      history: { type: 'string' },
      'session-timeout-ms': { type: 'string', default: '2000' },
      'interval-ms': { type: 'string', default: '50' },
      'work-ms': { type: 'string', default: '20' },
      'request-timeout-ms': { type: 'string', default: '3000' },
      door: { type: 'string', default: 'http' },
      pgwire: { type: 'string' },
    },
    strict: true,
  });
  const need = (k: 'id' | 'zk' | 'proxies' | 'fence-keys' | 'election-root' | 'history'): string => {
    const v = values[k];
    if (!v) throw new Error(`chaos writer: --${k} is required`);
    return v;
  };
  const id = need('id');
  const zk = need('zk');
  const root = need('election-root');
  const fenceKeys = need('fence-keys').split(',');
  const sessionTimeoutMs = Number(values['session-timeout-ms']);
  const intervalMs = Number(values['interval-ms']);
  const workMs = Number(values['work-ms']);
  const ledgers = new Set(fenceKeys.map(ledgerKey));
  const recorder = new HistoryRecorder(need('history'), id);
  const door = values.door as Door;
  if (!DOORS.includes(door)) throw new Error(`chaos writer: --door must be one of ${DOORS.join(', ')}`);
  const doorOptions = { door, ...(values.pgwire ? { pgwireUrls: values.pgwire.split(',') } : {}) };
  const client = new RecordingProxyClient(
    need('proxies').split(','),
    { writerId: id, timeoutMs: Number(values['request-timeout-ms']) },
    recorder,
    (k) => ledgers.has(k),
    doorOptions,
  );
  const emit = (e: Omit<WriterEvent, 't' | 'writer'>) => process.stdout.write(JSON.stringify({ t: Date.now(), writer: id, ...e }) + '\n');

  let stopping = false;
  const stop = () => {
    stopping = true;
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  // SIGUSR2 from the nemesis: freeze yourself (SIGSTOP) at the next write, after taking the token
  // and before sending, like a GC pause. A request not acted on within PAUSE_REQUEST_MS lapses (the
  // nemesis then stops the process itself), so a late one cannot freeze a resumed writer again.
  let pauseRequestedAt = -Infinity;
  process.on('SIGUSR2', () => (pauseRequestedAt = Date.now()));
  emit({ event: 'started' });

  const elections: Election[] = [];
  const writers: FencedWriter[] = [];

  /** Joins the election (retrying while the ensemble is unreachable), then writes while leader. */
  const run = async (fenceKey: string): Promise<void> => {
    let election: Election | null = null;
    while (!stopping) {
      const e = new Election({ connect: zk, path: `${root}/${fenceKey}`, id, sessionTimeoutMs });
      elections.push(e);
      try {
        await e.start();
        election = e;
        break;
      } catch {
        await e.close().catch(() => {});
        await sleep(250);
      }
    }
    if (!election) return;
    election.on('revoked', ({ token }) => emit({ event: 'revoked', fenceKey, token: token.toString() }));
    const writer = new FencedWriter({ election, proxy: client, fenceKey, retryDelayMs: 200 });
    writers.push(writer);
    writer.on('ready', ({ token }) => emit({ event: 'ready', fenceKey, token: token.toString() }));
    writer.on('stepped-down', ({ token }) => emit({ event: 'stepped-down', fenceKey, token: token.toString() }));
    let n = 0;
    while (!stopping) {
      await sleep(intervalMs);
      const token = writer.token;
      if (token === null || stopping) continue;
      n++;
      const key = n % 2 === 1 ? `${fenceKey}/${id}/${n}` : ledgerKey(fenceKey);
      const body = JSON.stringify({ writer: id, fenceKey, n });
      emit({ event: 'write-begin', fenceKey, token: token.toString() });
      if (Date.now() - pauseRequestedAt < PAUSE_REQUEST_MS) {
        pauseRequestedAt = -Infinity;
        process.kill(process.pid, 'SIGSTOP'); // stops here; SIGCONT resumes on the next line
      }
      const until = Date.now() + workMs;
      while (Date.now() < until); // synchronous work between taking the token and sending
      try {
        await writer.put(key, body, { contentType: 'application/json' });
      } catch {
        // recorded in the history; a 409 has made the writer step down
      }
    }
  };

  await Promise.all(fenceKeys.map(run));
  for (const w of writers) w.close();
  await client.close();
  await Promise.all(elections.map((e) => e.close().catch(() => {})));
  emit({ event: 'stopped' });
  return 0;
}
