// One demo replica: elects through ZooKeeper, and while leader writes one object through the proxy
// every interval. Each write does a little synchronous "work" between taking the token and sending,
// the window where a GC pause (here: SIGSTOP) turns a leader into a zombie. Events go to stdout as
// JSON lines for the demo to read. With --sql the replica writes through the proxy's SQL endpoint
// with node-postgres instead (a stale token there fails with SQLSTATE FP409); its fence advances
// stay HTTP, as for the others: one fence, two doors. With --sql and --pause-mid-transaction each
// write is an explicit transaction, `BEGIN; INSERT …; COMMIT`, on a key of its own under the object
// key, in the application table --table (sql-transaction.ts); a `hold` line on stdin makes the next one wait between its INSERT and its
// COMMIT until the process is resumed (SIGCONT), so the demo's SIGSTOP lands there every time.
// Run as a program (the demo spawns one per replica: dist/demo/writer.js from the package, this file
// with tsx from a checkout), it is that replica. docker-compose.yml's writers are demoWriterCommand
// too, through tools/cli.ts demo-writer.
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Election } from '../election/index.ts';
import { FencedWriter, NotLeaderError, ProxyClient, StaleTokenError } from '../writer/index.ts';
import { SqlDoor, SqlProxyClient, STALE_TOKEN_SQLSTATE } from './sql-door.ts';
import { SqlTransactionClient } from './sql-transaction.ts';

export interface DemoEvent {
  t: number;
  replica: string;
  event:
    | 'started'
    | 'elected'
    | 'ready'
    | 'revoked'
    | 'write-begin'
    | 'write-inserted'
    | 'write-accepted'
    | 'write-rejected'
    | 'write-refused'
    | 'write-error'
    | 'stepped-down'
    | 'stopped';
  token?: string;
  version?: number;
  highestToken?: string;
  reason?: string;
  body?: string;
  /** How the replica writes: HTTP (PUT /v1/objects) or SQL (the PostgreSQL-protocol endpoint). */
  door?: 'http' | 'sql';
  /** The SQLSTATE of a SQL write's refusal (FP409 for a stale token). */
  code?: string;
  /** The object key written. */
  key?: string;
  /** A SQL transaction's write: BEGIN; INSERT …; COMMIT (--pause-mid-transaction). */
  transaction?: boolean;
  /** write-inserted: the transaction waits for SIGCONT before its COMMIT. */
  held?: boolean;
}

export async function demoWriterCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      zk: { type: 'string' },
      path: { type: 'string' },
      id: { type: 'string' },
      proxy: { type: 'string' },
      'fence-key': { type: 'string' },
      'object-key': { type: 'string' },
      'session-timeout-ms': { type: 'string', default: '3000' },
      'interval-ms': { type: 'string', default: '200' },
      'work-ms': { type: 'string', default: '120' },
      /** postgres://host:port/database of the proxy's SQL endpoint: write through it. */
      sql: { type: 'string' },
      /** With --sql: each write is BEGIN; INSERT …; COMMIT; a `hold` line on stdin holds the next before its COMMIT. */
      'pause-mid-transaction': { type: 'boolean', default: false },
      /** --pause-mid-transaction: the table the transactions insert into. */
      table: { type: 'string' },
    },
    strict: true,
  });
  const need = (k: 'zk' | 'path' | 'id' | 'proxy' | 'fence-key' | 'object-key'): string => {
    const v = values[k];
    if (!v) throw new Error(`demo writer: --${k} is required`);
    return v;
  };
  const replica = need('id');
  const emit = (e: Omit<DemoEvent, 't' | 'replica'>) => process.stdout.write(JSON.stringify({ t: Date.now(), replica, ...e }) + '\n');
  const election = new Election({
    connect: need('zk'),
    path: need('path'),
    id: replica,
    sessionTimeoutMs: Number(values['session-timeout-ms']),
  });
  const clientOptions = { writerId: replica, ...(process.env.FENCEPOST_API_KEY ? { apiKey: process.env.FENCEPOST_API_KEY } : {}) };
  const txMode = values['pause-mid-transaction'] && values.sql !== undefined;
  if (txMode && !values.table) throw new Error('demo writer: --pause-mid-transaction needs --table');
  let holdNext = false;
  if (txMode) createInterface({ input: process.stdin }).on('line', (l) => (holdNext ||= l.trim() === 'hold'));
  const betweenInsertAndCommit = async (key: string, token: bigint): Promise<void> => {
    if (!holdNext) return;
    holdNext = false;
    const resumed = new Promise<void>((resolve) => process.once('SIGCONT', () => resolve()));
    emit({ event: 'write-inserted', token: token.toString(), key, held: true });
    await resumed;
  };
  const door = txMode
    ? null
    : values.sql
      ? new SqlDoor({
          url: values.sql,
          writerId: replica,
          ...(process.env.FENCEPOST_API_KEY ? { password: process.env.FENCEPOST_API_KEY } : {}),
        })
      : null;
  const txClient = txMode
    ? new SqlTransactionClient(need('proxy'), clientOptions, {
        url: values.sql!,
        writerId: replica,
        table: values.table!,
        betweenInsertAndCommit,
        ...(process.env.FENCEPOST_API_KEY ? { password: process.env.FENCEPOST_API_KEY } : {}),
      })
    : null;
  const proxy = txClient ?? (door ? new SqlProxyClient(need('proxy'), clientOptions, door) : new ProxyClient(need('proxy'), clientOptions));
  const writer = new FencedWriter({ election, proxy, fenceKey: need('fence-key') });
  const via = door || txClient ? ('sql' as const) : ('http' as const);
  election.on('elected', ({ token }) => emit({ event: 'elected', token: token.toString() }));
  election.on('revoked', ({ token, reason }) => emit({ event: 'revoked', token: token.toString(), reason }));
  writer.on('ready', ({ token }) => emit({ event: 'ready', token: token.toString() }));
  // Deferred so the 409 that caused it is reported first.
  writer.on('stepped-down', ({ token, highestToken }) =>
    setImmediate(() => emit({ event: 'stepped-down', token: token.toString(), highestToken: highestToken.toString() })),
  );

  let stopping = false;
  const stop = () => {
    stopping = true;
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  emit({ event: 'started', door: via });
  await election.start();

  const objectKey = need('object-key');
  const intervalMs = Number(values['interval-ms']);
  const workMs = Number(values['work-ms']);
  let seq = 0;
  while (!stopping) {
    await new Promise((r) => setTimeout(r, intervalMs));
    const token = writer.token;
    if (token === null || stopping) continue;
    const body = JSON.stringify({ replica, seq: ++seq, token: token.toString() });
    const key = txMode ? `${objectKey}/tx/${replica}-${seq}` : objectKey;
    const tx = txMode ? { transaction: true } : {};
    emit({ event: 'write-begin', token: token.toString(), key });
    const until = Date.now() + workMs;
    while (Date.now() < until); // synchronous work: the window a pause can hit
    try {
      const r = await writer.put(key, body, { contentType: 'application/json' });
      emit({ event: 'write-accepted', token: token.toString(), version: r.version, body, door: via, key, ...tx });
    } catch (err) {
      if (err instanceof StaleTokenError)
        emit({
          event: 'write-rejected',
          token: token.toString(),
          highestToken: err.highestToken.toString(),
          body,
          door: via,
          key,
          ...tx,
          ...(via === 'sql' ? { code: STALE_TOKEN_SQLSTATE } : {}),
        });
      else if (err instanceof NotLeaderError) emit({ event: 'write-refused', token: token.toString() });
      else emit({ event: 'write-error', token: token.toString(), reason: err instanceof Error ? err.message : String(err) });
    }
  }
  writer.close();
  await door?.close();
  await txClient?.close();
  await election.close();
  emit({ event: 'stopped' });
  return 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  demoWriterCommand(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`demo writer: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(1);
    },
  );
}
