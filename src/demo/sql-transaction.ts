// The demo's SQL writer in --pause-mid-transaction mode: each write is an explicit transaction on
// the proxy's SQL endpoint with node-postgres, `BEGIN; INSERT …; COMMIT`, on a session per fence key
// and token (the token and fence key as startup options, as sql-door.ts). The INSERT adds a row
// of the write's own to an application table (demoLedgerTable: the demo creates it, grants it to the
// client login and protects it with the demo's fence key), so the database can be asked afterwards
// whether a given transaction committed: its row is there or it is not.
//
// `betweenInsertAndCommit` runs between the INSERT and the COMMIT: the demo freezes the writer at
// that point (SIGSTOP), a newer leader's raise ends its connection (and the open transaction) on
// the database side, and the COMMIT sent after SIGCONT fails with FP409, thrown as the HTTP
// client's StaleTokenError so a FencedWriter steps down on it as on a 409.
import { ProxyClient, type ProxyClientOptions, type PutResult } from '../writer/index.ts';
import { FencedSessions, MAYBE_COMMITTED, SqlDoorError, STALE_TOKEN_SQLSTATE, sqlStateOf, staleError } from './sql-door.ts';

/** The table the transactions insert into: one row per write, its key the primary key. */
export function demoLedgerTable(table: string): string {
  return `CREATE TABLE ${table} (key text PRIMARY KEY, token bigint NOT NULL, body text NOT NULL)`;
}

export interface SqlTransactionOptions {
  /** The endpoint: postgres://host:port/database (user and password are not read). */
  url: string;
  writerId: string;
  password?: string;
  /** Schema-qualified table of demoLedgerTable's shape. */
  table: string;
  /** Runs after the INSERT, before the COMMIT is sent. */
  betweenInsertAndCommit: (key: string, token: bigint) => Promise<void>;
}

/** A ProxyClient whose object writes are SQL transactions; fence advances stay HTTP. */
export class SqlTransactionClient extends ProxyClient {
  private readonly sessions: FencedSessions;

  constructor(
    baseUrl: string,
    clientOptions: ProxyClientOptions,
    private readonly tx: SqlTransactionOptions,
  ) {
    super(baseUrl, clientOptions);
    // No query timeout: the writer may be frozen between its INSERT and its COMMIT.
    this.sessions = new FencedSessions({ ...tx, queryTimeout: false });
  }

  override async put(key: string, body: string | Uint8Array, o: { token: bigint; fenceKey?: string }): Promise<PutResult> {
    const fenceKey = o.fenceKey ?? key;
    const s = this.sessions.session(fenceKey, o.token);
    let stage: 'connect' | 'BEGIN' | 'INSERT' | 'COMMIT' = 'connect';
    try {
      await s.ready;
      stage = 'BEGIN';
      await s.client.query('BEGIN');
      stage = 'INSERT';
      await s.client.query({
        text: `INSERT INTO ${this.tx.table} (key, token, body) VALUES ($1, $2, $3)`,
        values: [key, o.token.toString(), typeof body === 'string' ? body : Buffer.from(body).toString('utf8')],
      });
      await this.tx.betweenInsertAndCommit(key, o.token);
      stage = 'COMMIT';
      await s.client.query('COMMIT');
      return { key, fenceKey, token: o.token, version: 1 };
    } catch (err) {
      const e = err as { message?: string };
      const code = sqlStateOf(err);
      // The transaction is over either way: a session that failed in one is not used again.
      this.sessions.drop(fenceKey, s);
      if (code === STALE_TOKEN_SQLSTATE) throw staleError(err, { token: o.token, fenceKey });
      const indeterminate = stage === 'COMMIT' && (code === null || MAYBE_COMMITTED.test(code));
      throw new SqlDoorError(
        `SQL ${stage} ${code ?? 'failed'}: ${e.message ?? String(err)}`,
        code,
        indeterminate,
        stage === 'connect' && (err as { code?: string }).code === 'ECONNREFUSED',
        err,
      );
    }
  }

  close(): Promise<void> {
    return this.sessions.close();
  }
}
