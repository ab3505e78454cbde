// The backend connection of a session: a socket to Postgres, logged in as the key's client login
// (src/fence/client-logins.ts), started read-only with the statement and lock timeouts and the
// key's pgRole, carrying the writer's fencepost settings.
import { connect, isIP, type OnReadOpts, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { createHash } from 'node:crypto';
import { BodyReader, MessageReader, type Frame } from './wire/framing.ts';
import { dataRowTexts, parseErrorFields } from './wire/backend.ts';
import { optionArg } from './startup.ts';
import { encode } from './wire/frontend.ts';
import { ScramClient, ScramError, MECHANISM } from '../access/scram.ts';
import { SQLSTATE } from '../../fence/index.ts';
import { databaseTarget, type DatabaseTarget, describeHost, type DatabaseHost } from '../../fence/admin.ts';

export type BackendTarget = DatabaseTarget;

/**
 * Where DATABASE_URL points (a host starting with `/` is a Unix socket folder), and its TLS. With
 * several hosts, `follow` picks the host at each openBackend.
 */
export function backendTarget(databaseUrl: string): BackendTarget {
  return databaseTarget(databaseUrl);
}

const SSL_REQUEST = encode({ type: 'sslRequest' });

/**
 * Bytes of each slab the reads of a backend connection go into: one read of a large answer takes
 * at most what is left of it, and a session holds about one slab.
 */
const SLAB_BYTES = 64 * 1024;
/** The least room a slab must have left to be read into again. */
const MIN_READ_BYTES = 8 * 1024;

/**
 * Reads of a socket through net's `onread`: each read goes into the part of a slab no earlier read
 * used (a chunk a listener keeps is never written over), and the chunk is emitted as 'data' at
 * once, without a Readable stream's push, read and nextTick per read (bench/log/2026-12-06-proxy-cpu.md).
 * pause() and resume() work as always (net stops and starts reading), and the end of the stream
 * is reported as always.
 */
function slabReads(socket: () => Socket): OnReadOpts {
  let slab = Buffer.allocUnsafeSlow(SLAB_BYTES);
  let used = 0;
  return {
    buffer: () => {
      if (SLAB_BYTES - used < MIN_READ_BYTES) {
        slab = Buffer.allocUnsafeSlow(SLAB_BYTES);
        used = 0;
      }
      return slab.subarray(used);
    },
    callback: (n, buf) => {
      if (buf.buffer === slab.buffer) used = buf.byteOffset + n;
      socket().emit('data', Buffer.from(buf.buffer, buf.byteOffset, n));
      return true;
    },
  };
}

/**
 * A connection to the database, ready for a startup or cancel packet: over TLS when DATABASE_URL
 * asks for it (an SSLRequest first; a server that answers `N` is refused, as node-postgres does).
 * Not ready within `timeoutMs` (no answer to the connect, the SSLRequest or the handshake): closed.
 */
function dial(target: BackendTarget, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    // A plain connection reads into slices of a slab, handed straight to its 'data' listeners
    // (slabReads); under TLS the socket reads as usual.
    const reads: OnReadOpts | undefined = target.tls === null ? slabReads(() => raw) : undefined;
    const raw: Socket = target.host.startsWith('/')
      ? connect({ path: `${target.host}/.s.PGSQL.${target.port}`, ...(reads ? { onread: reads } : {}) })
      : connect({ host: target.host, port: target.port, ...(reads ? { onread: reads } : {}) });
    raw.setNoDelay(true);
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      raw.destroy();
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new BackendStartupError(SQLSTATE.CONNECTION_FAILURE, `the database did not answer within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const done = (socket: Socket) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      raw.off('close', onClose);
      // From here the session's handlers watch `socket`; under TLS its errors also reach the raw
      // socket, which must not throw them.
      raw.off('error', fail);
      raw.on('error', () => {});
      resolve(socket);
    };
    const onClose = () => fail(new BackendStartupError(SQLSTATE.CONNECTION_FAILURE, 'the database closed the connection before startup'));
    raw.once('error', fail);
    raw.once('close', onClose);
    const tlsOptions = target.tls;
    if (tlsOptions === null) {
      raw.once('connect', () => done(raw));
      return;
    }
    raw.once('connect', () => raw.write(SSL_REQUEST));
    raw.once('data', (answer: Buffer) => {
      if (answer.length !== 1 || answer[0] !== 0x53 /* S */) {
        fail(
          new BackendStartupError(
            SQLSTATE.CONNECTION_FAILURE,
            answer[0] === 0x4e
              ? 'the database does not accept TLS, and DATABASE_URL asks for it (sslmode)'
              : 'the database answered the TLS request with an error',
          ),
        );
        return;
      }
      // SNI never carries an IP address (RFC 6066); the certificate is checked against `host` then.
      const secure = tlsConnect({
        ...tlsOptions,
        socket: raw,
        host: target.host,
        ...(isIP(target.host) === 0 ? { servername: target.host } : {}),
      });
      secure.once('error', fail);
      secure.once('secureConnect', () => {
        secure.off('error', fail);
        secure.setNoDelay(true);
        done(secure);
      });
    });
  });
}

export interface BackendLogin {
  user: string;
  password: string;
  /** Startup parameters (application_name, client_encoding, …). */
  parameters: Map<string, string>;
  /** `-c` settings for `options`. */
  settings: Map<string, string>;
}

export interface Backend {
  socket: Socket;
  pid: number;
  secret: Buffer;
  /** The backend's ParameterStatus messages, as sent. */
  parameterStatus: Buffer[];
  /** Framing of what the backend sends next (bytes after ReadyForQuery may already be in it). */
  reader: MessageReader;
  /** The host it runs on (of several, the one picked): a cancel goes there. */
  target: BackendTarget;
}

/** A backend's ErrorResponse during startup, with its SQLSTATE. */
export class BackendStartupError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'BackendStartupError';
  }
}

/** A ParameterStatus message's name and value. */
function statusOf(b: Buffer): [string, string] {
  const end = b.indexOf(0, 5);
  return [b.toString('latin1', 5, end), b.toString('utf8', end + 1, b.indexOf(0, end + 1))];
}

/**
 * Opens and logs in a backend connection; resolves at its first ReadyForQuery. With several hosts:
 * on the one the finder picks (none: 08001); a host that fails tells the finder, and one that
 * reports in_hot_standby at login (Postgres 14+) is left (08001) as node-postgres's pools leave it.
 */
export async function openBackend(target: BackendTarget, login: BackendLogin, timeoutMs: number): Promise<Backend> {
  const started = Date.now();
  const follow = target.follow;
  let at: BackendTarget = target;
  let host: DatabaseHost | null = null;
  if (follow) {
    try {
      host = await follow.target();
    } catch (err) {
      throw new BackendStartupError(SQLSTATE.SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, err instanceof Error ? err.message : String(err));
    }
    at = { host: host.host, port: host.port, database: target.database, tls: target.tls };
  }
  let backend: Backend;
  try {
    const socket = await dial(at, Math.max(1, timeoutMs - (Date.now() - started)));
    backend = await logIn(socket, login, at, Math.max(1, timeoutMs - (Date.now() - started)));
  } catch (err) {
    const code = err instanceof BackendStartupError ? err.code : undefined;
    if (follow && host && (code === undefined || code.startsWith('08') || code.startsWith('57P'))) follow.suspect(host);
    throw err;
  }
  if (
    follow &&
    host &&
    follow.opts.attrs !== 'any' &&
    backend.parameterStatus.some((b) => statusOf(b)[0] === 'in_hot_standby' && statusOf(b)[1] === 'on')
  ) {
    backend.socket.destroy();
    follow.suspect(host);
    throw new BackendStartupError(
      SQLSTATE.SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
      `${describeHost(host)} is in hot standby (target_session_attrs=${follow.opts.attrs}); looking for the primary again`,
    );
  }
  return backend;
}

function logIn(socket: Socket, login: BackendLogin, target: BackendTarget, timeoutMs: number): Promise<Backend> {
  const database = target.database;
  return new Promise((resolve, reject) => {
    const reader = new MessageReader();
    const parameterStatus: Buffer[] = [];
    let pid = 0;
    let secret = Buffer.alloc(0);
    let scram: ScramClient | null = null;
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      cleanup();
      socket.destroy();
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new BackendStartupError(SQLSTATE.CONNECTION_FAILURE, `the database did not answer within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const cleanup = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('error', fail);
      socket.off('close', onClose);
    };
    const onClose = () => fail(new BackendStartupError(SQLSTATE.CONNECTION_FAILURE, 'the database closed the connection during startup'));
    const onFrame = (f: Frame) => {
      switch (f.type) {
        case 'R': {
          const r = new BodyReader(f.body);
          const kind = r.int32();
          if (kind === 0) return;
          if (kind === 3) socket.write(encode({ type: 'password', password: login.password }));
          else if (kind === 5) {
            const salt = r.bytes(4);
            const inner = createHash('md5')
              .update(login.password + login.user)
              .digest('hex');
            const md5 = createHash('md5')
              .update(Buffer.concat([Buffer.from(inner), salt]))
              .digest('hex');
            socket.write(encode({ type: 'password', password: `md5${md5}` }));
          } else if (kind === 10) {
            const mechanisms: string[] = [];
            for (let m = r.cstring(); m !== ''; m = r.cstring()) mechanisms.push(m);
            if (!mechanisms.includes(MECHANISM))
              throw new BackendStartupError(
                SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
                `the database offers ${mechanisms.join(', ')}, not ${MECHANISM}`,
              );
            scram = new ScramClient(login.password);
            socket.write(encode({ type: 'saslInitial', mechanism: MECHANISM, data: scram.first() }));
          } else if (kind === 11) {
            if (!scram) throw new BackendStartupError(SQLSTATE.PROTOCOL_VIOLATION, 'unexpected SASL continue');
            // The server waits for this answer: nothing else arrives while the key is derived.
            scram.final(r.rest().toString('utf8')).then(
              (final) => {
                if (!settled) socket.write(encode({ type: 'saslResponse', data: final }));
              },
              (err: unknown) =>
                fail(
                  err instanceof ScramError
                    ? new BackendStartupError(SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION, err.message)
                    : err instanceof Error
                      ? err
                      : new Error(String(err)),
                ),
            );
          } else if (kind === 12) {
            if (!scram) throw new BackendStartupError(SQLSTATE.PROTOCOL_VIOLATION, 'unexpected SASL final');
            scram.verify(r.rest().toString('utf8'));
          } else
            throw new BackendStartupError(
              SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
              `the database asks for an authentication method the proxy does not speak (${kind})`,
            );
          return;
        }
        case 'S':
          parameterStatus.push(Buffer.from(f.bytes));
          return;
        case 'K': {
          const r = new BodyReader(f.body);
          pid = r.int32();
          secret = Buffer.from(r.rest());
          return;
        }
        case 'N':
        case 'v':
          return;
        case 'E': {
          const fields = parseErrorFields(f.body);
          throw new BackendStartupError(
            fields.get('C') ?? SQLSTATE.CONNECTION_FAILURE,
            fields.get('M') ?? 'the database refused the connection',
          );
        }
        case 'Z':
          settled = true;
          cleanup();
          resolve({ socket, pid, secret, parameterStatus, reader, target });
          return;
        default:
          throw new BackendStartupError(SQLSTATE.PROTOCOL_VIOLATION, `unexpected message ${JSON.stringify(f.type)} during startup`);
      }
    };
    const onData = (chunk: Buffer) => feedFrames(reader, chunk, onFrame, () => settled, fail);
    socket.on('data', onData);
    socket.on('error', fail);
    socket.on('close', onClose);
    const options = [...login.settings].map(([k, v]) => optionArg(k, v)).join(' ');
    const params: [string, string][] = [
      ['user', login.user],
      ['database', database],
    ];
    for (const [k, v] of login.parameters) params.push([k, v]);
    if (options !== '') params.push(['options', options]);
    socket.write(encode({ type: 'startup', params }));
  });
}

/** Feeds `chunk` to `reader` and hands each whole frame to `onFrame` until `done()`; a malformed stream goes to `fail`. */
function feedFrames(
  reader: MessageReader,
  chunk: Buffer,
  onFrame: (f: Frame) => void,
  done: () => boolean,
  fail: (err: Error) => void,
): void {
  try {
    reader.push(chunk);
    for (let f = reader.next(); f !== null && !done(); f = reader.next()) onFrame(f);
  } catch (err) {
    fail(err instanceof Error ? err : new Error(String(err)));
  }
}

/** Sends a CancelRequest for the backend's pid and secret (on a connection of its own, TLS as the session's): `target` is the backend's. */
export function cancelBackend(target: BackendTarget, pid: number, secret: Buffer): Promise<void> {
  // Resolves once Postgres has closed the cancel connection (it has signalled the backend by then),
  // or after 5 s: the writer hears its cancel connection close only after that, as libpq's PQcancel
  // waits for the server, so its next statement is not the one cancelled.
  return new Promise((resolve) => {
    dial(target, 5000).then(
      (s) => {
        s.on('error', () => {});
        s.once('close', () => resolve());
        s.setTimeout(5000, () => s.destroy());
        s.end(encode({ type: 'cancelRequest', pid, secret }));
      },
      () => resolve(), // best effort, as a driver's cancel is
    );
  });
}

/**
 * The backend as the fence asks its questions of it (Fence.enterSession, warmSession): its pid, and
 * a Query of the proxy's answered with each row's first column and Postgres's error, if any.
 */
export function fenceQuestions(backend: Backend, timeoutMs: number) {
  return {
    pid: backend.pid,
    query: async (sql: string) => {
      const a = await queryBackend(backend, sql, timeoutMs);
      return {
        rows: a.rows.map((r) => r[0] ?? ''),
        error: a.error === null ? null : { code: a.error.get('C') ?? null, message: a.error.get('M') ?? null },
      };
    },
  };
}

/** What a Query of the proxy's on a session's backend answered: each row's texts, and its error, if any. */
export interface BackendAnswer {
  rows: string[][];
  error: Map<string, string> | null;
}

/**
 * Sends a simple Query of the proxy's on a backend no writer's message has reached yet (the
 * session's startup fence), and reads its answer up to its ReadyForQuery. ParameterStatus messages
 * it causes are kept in the backend's list (the writer is told them at startup); notices are
 * dropped. Rejects when the backend goes away first or does not answer within `timeoutMs`.
 */
export function queryBackend(backend: Backend, sql: string, timeoutMs: number): Promise<BackendAnswer> {
  const { socket, reader } = backend;
  return new Promise((resolve, reject) => {
    const rows: string[][] = [];
    let error: Map<string, string> | null = null;
    let settled = false;
    const finish = (err: Error | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.off('error', onClose);
      if (err !== null) reject(err);
      else resolve({ rows, error });
    };
    const onClose = () => finish(new Error('the database closed the connection'));
    const timer = setTimeout(() => finish(new Error(`the database did not answer within ${timeoutMs} ms`)), timeoutMs);
    const onFrame = (f: Frame) => {
      switch (f.type) {
        case 'D':
          rows.push(dataRowTexts(f.body));
          return;
        case 'E':
          error = parseErrorFields(f.body);
          return;
        case 'S': {
          const name = statusOf(f.bytes)[0];
          const kept = backend.parameterStatus.filter((b) => statusOf(b)[0] !== name);
          backend.parameterStatus.length = 0;
          backend.parameterStatus.push(...kept, Buffer.from(f.bytes));
          return;
        }
        case 'Z':
          finish(null);
          return;
        default: // RowDescription, CommandComplete, notices
      }
    };
    const onData = (chunk: Buffer) => feedFrames(reader, chunk, onFrame, () => settled, finish);
    socket.on('data', onData);
    socket.on('close', onClose);
    socket.on('error', onClose);
    socket.write(encode({ type: 'query', text: sql }));
  });
}
