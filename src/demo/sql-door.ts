// Writes an object through the proxy's SQL endpoint (PostgreSQL protocol, FENCEPOST_PGWIRE_PORT)
// with node-postgres, as a writer that keeps its Postgres driver does: one session per fence key
// and token (the token and fence key as startup options: the endpoint fences the connection), one
// statement per write, in an implicit transaction. The statement is the upsert a fenced PUT
// runs on fencepost.objects, so the harness's checkers read SQL writes where they read HTTP ones;
// the client login needs SELECT, INSERT, UPDATE on fencepost.objects and its incarnation sequence
// (grantObjectWrites).
//
// A stale token (SQLSTATE FP409, at connect or from a session a raise ended) is thrown as the HTTP
// client's StaleTokenError, so a FencedWriter steps down on it as on a 409. Other failures are
// SqlDoorError, `indeterminate` when the write may have committed (connection lost, timeout, the
// backend died or was shut down).
import pg from 'pg';
import { ProxyClient, StaleTokenError, fenceRefusal, type ProxyClientOptions, type PutResult } from '../writer/index.ts';
import { STALE_TOKEN } from '../fence/index.ts';

export const STALE_TOKEN_SQLSTATE = STALE_TOKEN;

export interface SqlDoorOptions {
  /** The endpoint: postgres://host:port/database (user and password are not read). */
  url: string;
  /** The startup user name: the writer id the proxy logs. */
  writerId: string;
  password?: string;
  /** Deadline of the connection and of each write. Default 10 000 ms. */
  timeoutMs?: number;
}

export class SqlDoorError extends Error {
  /** SQLSTATE, or null when no answer came (connection error, timeout). */
  readonly code: string | null;
  /** The write may have committed. */
  readonly indeterminate: boolean;
  /** The endpoint could not be reached at all (nothing was sent). */
  readonly refused: boolean;
  constructor(message: string, code: string | null, indeterminate: boolean, refused: boolean, cause: unknown) {
    super(message, { cause });
    this.name = 'SqlDoorError';
    this.code = code;
    this.indeterminate = indeterminate;
    this.refused = refused;
  }
}

/** Connection loss, shutdown, resources, internal errors: the server may have committed before it. */
export const MAYBE_COMMITTED = /^(08|57|53|58|XX|40P)/;

export const UPSERT_OBJECT = `INSERT INTO fencepost.objects AS o (key, fence_key, token, version, content_type, body)
  VALUES ($1, $2, $3, 1, 'application/json', convert_to($4, 'UTF8'))
  ON CONFLICT (key) DO UPDATE SET fence_key = EXCLUDED.fence_key, token = EXCLUDED.token, version = o.version + 1,
    content_type = EXCLUDED.content_type, body = EXCLUDED.body, updated_at = now()
  RETURNING o.version::int AS version`;

/** What the open-mode client login needs to write objects through the endpoint (run as the owner). */
export function grantObjectWrites(login: string): string {
  const l = pg.escapeIdentifier(login);
  // The fence's own schema: fine for the open mode's one login (one tenant), which is all the demo
  // and the chaos run have; a key's login or pgRole must never name it (docs/security.md).
  return `GRANT USAGE ON SCHEMA fencepost TO ${l}; GRANT SELECT, INSERT, UPDATE ON fencepost.objects TO ${l}; GRANT USAGE ON SEQUENCE fencepost.object_incarnations TO ${l}`;
}

export interface Session {
  token: bigint;
  client: pg.Client;
  ready: Promise<void>;
}

/** A startup option's value as Postgres reads `options`: spaces and backslashes escaped. */
const optionValue = (v: string): string => v.replace(/[\\ ]/g, '\\$&');

/**
 * A writer's sessions on the SQL endpoint, one per fence key: a new token gets a new session (the
 * token and fence key are startup options: the endpoint fences the connection once, at connect).
 */
export class FencedSessions {
  private readonly sessions = new Map<string, Session>();

  constructor(private readonly opts: SqlDoorOptions & { queryTimeout?: boolean }) {}

  /** The session for a fence key with this token, connecting (`ready`) if it is new. */
  session(fenceKey: string, token: bigint): Session {
    const cur = this.sessions.get(fenceKey);
    if (cur && cur.token === token) return cur;
    if (cur) this.drop(fenceKey, cur);
    const u = new URL(this.opts.url);
    const timeout = this.opts.timeoutMs ?? 10_000;
    const client = new pg.Client({
      host: u.hostname,
      port: Number(u.port || 5432),
      database: decodeURIComponent(u.pathname.replace(/^\//, '')),
      user: this.opts.writerId,
      password: this.opts.password ?? '',
      options: `-c fencepost.token=${token} -c fencepost.fence_key=${optionValue(fenceKey)}`,
      connectionTimeoutMillis: timeout,
      ...(this.opts.queryTimeout === false ? {} : { query_timeout: timeout }),
    });
    const s: Session = { token, client, ready: client.connect().then(() => undefined) };
    client.on('error', () => this.drop(fenceKey, s));
    s.ready.catch(() => {});
    this.sessions.set(fenceKey, s);
    return s;
  }

  /** Not used again: closed, and forgotten if it is still the fence key's. */
  drop(fenceKey: string, s: Session): void {
    if (this.sessions.get(fenceKey) === s) this.sessions.delete(fenceKey);
    s.client.end().catch(() => {});
  }

  async close(): Promise<void> {
    const all = [...this.sessions.values()];
    this.sessions.clear();
    await Promise.all(all.map((s) => s.client.end().catch(() => {})));
  }
}

/** The SQLSTATE of a driver error, or null when no answer came (connection error, timeout). */
export function sqlStateOf(err: unknown): string | null {
  const code = (err as { code?: unknown }).code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : null;
}

export class SqlDoor {
  readonly url: string;
  private readonly sessions: FencedSessions;

  constructor(opts: SqlDoorOptions) {
    this.url = opts.url;
    this.sessions = new FencedSessions(opts);
  }

  async put(key: string, body: string, o: { token: bigint; fenceKey: string }): Promise<PutResult> {
    const s = this.sessions.session(o.fenceKey, o.token);
    try {
      await s.ready;
    } catch (err) {
      this.sessions.drop(o.fenceKey, s);
      const code = (err as { code?: string }).code;
      // A stale token is refused at connect: as stale as a refused write.
      if (code === STALE_TOKEN_SQLSTATE) throw staleError(err, o);
      throw new SqlDoorError(`cannot connect to the SQL endpoint ${this.url}: ${String(err)}`, null, false, code === 'ECONNREFUSED', err);
    }
    try {
      const r = await s.client.query<{ version: number }>({ text: UPSERT_OBJECT, values: [key, o.fenceKey, o.token.toString(), body] });
      return { key, fenceKey: o.fenceKey, token: o.token, version: r.rows[0]!.version };
    } catch (err) {
      const e = err as { message?: string };
      const code = sqlStateOf(err);
      if (code === STALE_TOKEN_SQLSTATE) {
        // A newer leader's raise ended the session: the next token gets a new one.
        this.sessions.drop(o.fenceKey, s);
        throw staleError(err, o);
      }
      // A session that did not answer, or whose backend is gone, is not used again.
      if (code === null || MAYBE_COMMITTED.test(code)) this.sessions.drop(o.fenceKey, s);
      throw new SqlDoorError(
        `SQL write ${code ?? 'failed'}: ${e.message ?? String(err)}`,
        code,
        code === null || MAYBE_COMMITTED.test(code),
        false,
        err,
      );
    }
  }

  close(): Promise<void> {
    return this.sessions.close();
  }
}

/** A refusal of a stale token (FP409), as the HTTP client's StaleTokenError. */
export function staleError(err: unknown, o: { token: bigint; fenceKey: string }): StaleTokenError {
  const e = err as { message?: string };
  // The refusal's fields as the endpoint sent them (fencepost/writer fenceRefusal reads its DETAIL).
  const highest = fenceRefusal(err)?.highestToken?.toString();
  return new StaleTokenError(409, {
    error: 'stale_token',
    message: e.message ?? String(err),
    fenceKey: o.fenceKey,
    token: o.token.toString(),
    highestToken: highest ?? '0',
  });
}

/**
 * A ProxyClient whose writes go through the SQL endpoint: fence advances stay HTTP (PUT
 * /v1/fences on `baseUrl`), object writes are SQL. One fence, two doors.
 */
export class SqlProxyClient extends ProxyClient {
  readonly door: SqlDoor;
  constructor(baseUrl: string, opts: ProxyClientOptions, door: SqlDoor) {
    super(baseUrl, opts);
    this.door = door;
  }

  override async put(key: string, body: string | Uint8Array, o: { token: bigint; fenceKey?: string }): Promise<PutResult> {
    return await this.door.put(key, typeof body === 'string' ? body : Buffer.from(body).toString('utf8'), {
      token: o.token,
      fenceKey: o.fenceKey ?? key,
    });
  }
}
