// The lesson's worked example 2 with a transaction, under `fencepost elect --proxy`: N replicas
// each run tools/demo/txn-writer.py (psycopg2, the proxy's SQL endpoint) looping BEGIN; INSERT;
// COMMIT. The leader's writer is made to hold a transaction between its INSERT and its COMMIT and
// the whole replica (elect and its writer) is frozen with SIGSTOP, past the session timeout. A new
// leader is elected, its fence advance (PUT /v1/fences) waits FENCEPOST_RAISE_WAIT_MS for the open
// transaction, ends it and commits, and its writer's first transaction commits. Then the zombie's
// writer is resumed first (its COMMIT goes out before its elect, waking, could stop it) and its
// COMMIT fails (FP409 is what the proxy answers; see the test for what psycopg2 reports); then its
// elect. Used by a test (outcomes) and by bench/ (the time).
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'fencepost.js');
const WRITER = join(import.meta.dirname, 'txn-writer.py');
const PYTHON = process.env.FENCEPOST_PYTHON ?? '/usr/bin/python3';

export interface WriterEvent {
  t: number;
  replica: string;
  token: string;
  pid: number;
  event: 'started' | 'holding' | 'committed' | 'commit-failed';
  key?: string;
  /** commit-failed: the SQLSTATE psycopg2 reports (null when libpq gave none) and the message. */
  code?: string | null;
  message?: string;
}

export interface ElectedTransactionOptions {
  zkConnect: string;
  electionPath: string;
  /** The proxy's HTTP URL (elect's fence advance). */
  proxyUrl: string;
  /** host:port/database of the proxy's SQL endpoint. */
  pgwire: string;
  /** A table (key text PRIMARY KEY, token bigint) the client login may INSERT into. */
  table: string;
  fenceKey: string;
  /** The table's owner, to read it back. */
  pool: pg.Pool;
  sessionTimeoutMs: number;
  replicas?: number;
}

export interface ElectedTransactionResult {
  zombie: { replica: string; token: string; key: string };
  successor: { replica: string; token: string };
  /** The zombie's COMMIT after SIGCONT. */
  zombieCommit: WriterEvent;
  /** The new leader's first committed transaction. */
  firstWrite: WriterEvent;
  /** SIGSTOP of the leader → the new leader's first committed transaction, in ms. */
  freezeToFirstWriteMs: number;
  /** The zombie's held row is in the table (it must not be). */
  zombieRowPresent: boolean;
  /** Every committed key is in the table with its token. */
  missingCommitted: string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function runElectedTransaction(o: ElectedTransactionOptions): Promise<ElectedTransactionResult> {
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-elected-tx-'));
  const logFile = join(dir, 'writers.log');
  const hold = join(dir, 'hold');
  const read = (): WriterEvent[] =>
    existsSync(logFile)
      ? readFileSync(logFile, 'utf8')
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l) as WriterEvent)
      : [];
  const until = async <T>(what: string, f: () => T | undefined, timeoutMs = 30_000): Promise<T> => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const v = f();
      if (v !== undefined) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; writers: ${readFileSync(logFile, 'utf8')}`);
      await sleep(10);
    }
  };
  const elects = new Map<string, ChildProcess>();
  const stderr = new Map<string, string>();
  try {
    for (let i = 1; i <= (o.replicas ?? 3); i++) {
      const id = `r${i}`;
      const child = spawn(
        process.execPath,
        [
          BIN,
          'elect',
          '--zk',
          o.zkConnect,
          '--path',
          o.electionPath,
          '--id',
          id,
          '--session-timeout-ms',
          String(o.sessionTimeoutMs),
          '--grace-ms',
          '1000',
          '--proxy',
          o.proxyUrl,
          '--fence-key',
          o.fenceKey,
          '--',
          PYTHON,
          WRITER,
        ],
        {
          env: {
            ...process.env,
            WRITER_PGWIRE: o.pgwire,
            WRITER_TABLE: o.table,
            WRITER_LOG: logFile,
            WRITER_HOLD: hold,
            WRITER_INTERVAL_MS: '100',
          },
          stdio: ['ignore', 'ignore', 'pipe'],
        },
      );
      stderr.set(id, '');
      child.stderr!.on('data', (d: Buffer) => stderr.set(id, (stderr.get(id)! + d.toString()).slice(-8000)));
      elects.set(id, child);
    }
    // A leader commits; then its next transaction holds before COMMIT, and the replica is frozen.
    await until("a leader's first commit", () => read().find((e) => e.event === 'committed'));
    writeFileSync(hold, '');
    const held = await until('the leader to hold a transaction', () => read().find((e) => e.event === 'holding'));
    const elect = elects.get(held.replica)!;
    elect.kill('SIGSTOP');
    process.kill(held.pid, 'SIGSTOP');
    const frozenAt = Date.now();
    const firstWrite = await until(
      "the new leader's first commit",
      () => read().find((e) => e.event === 'committed' && e.replica !== held.replica && BigInt(e.token) > BigInt(held.token)),
      o.sessionTimeoutMs + 30_000,
    );
    // Resume the zombie's writer first: its COMMIT is the zombie's write.
    process.kill(held.pid, 'SIGCONT');
    const zombieCommit = await until(
      "the zombie's COMMIT",
      () => read().find((e) => e.pid === held.pid && (e.event === 'commit-failed' || (e.event === 'committed' && e.key === held.key))),
      15_000,
    );
    elect.kill('SIGCONT');
    const { rows } = await o.pool.query<{ key: string; token: string }>(`SELECT key, token::text FROM ${o.table}`);
    const stored = new Map(rows.map((r) => [r.key, r.token]));
    const committed = read().filter((e) => e.event === 'committed');
    return {
      zombie: { replica: held.replica, token: held.token, key: held.key! },
      successor: { replica: firstWrite.replica, token: firstWrite.token },
      zombieCommit,
      firstWrite,
      freezeToFirstWriteMs: Math.round(firstWrite.t - frozenAt),
      zombieRowPresent: stored.has(held.key!),
      missingCommitted: committed.filter((e) => stored.get(e.key!) !== e.token).map((e) => e.key!),
    };
  } catch (err) {
    throw new Error(`${(err as Error).message}\n${[...stderr].map(([id, s]) => `--- ${id}\n${s}`).join('\n')}`, { cause: err });
  } finally {
    for (const c of elects.values()) {
      if (c.exitCode !== null || c.signalCode !== null) continue;
      c.kill('SIGCONT');
      c.kill('SIGTERM');
    }
    await Promise.all(
      [...elects.values()].map((c) => (c.exitCode !== null || c.signalCode !== null ? null : new Promise((r) => c.once('exit', r)))),
    );
    rmSync(dir, { recursive: true, force: true });
  }
}
