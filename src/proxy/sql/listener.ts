// The SQL endpoint's listener: accepts PostgreSQL protocol connections, runs the startup phase
// (SSLRequest, CancelRequest, StartupMessage, authentication), opens the session's backend
// connection as the key's client login, and hands over to PgwireSession.
//
// Authentication: in open mode any user name is accepted (it is the writer id). With keys, the
// user name is the key's name and the password its bearer key, checked with SCRAM-SHA-256 (the
// key's salted SCRAM keys are derived at start-up from its `secret`; a key given only as
// `secretSha256` can log in only over TLS, with a cleartext password). Cleartext passwords are
// asked for only on a TLS session, and only for keys without SCRAM keys. A name that is no key
// goes through the same exchange with made-up keys and a salt stable for the name
// (mockScramSecret), and fails at the proof.
//
// A full endpoint (FENCEPOST_PGWIRE_MAX_CONNECTIONS) still negotiates TLS and reads the startup
// packet, then refuses with 53300, as Postgres does.
//
// TLS (FENCEPOST_TLS_CERT / _KEY, the proxy's shared TlsMaterial): an SSLRequest is answered 'S'
// and the socket upgraded with the material's current SecureContext (a SIGHUP reload applies to
// new sessions). Bytes that arrive after the SSLRequest before the handshake are refused, not
// read as part of the session (CVE-2021-23222's class: an attacker in the middle could prepend
// plaintext that the server would take as sent inside TLS). With TLS configured every session
// must use it (as HTTP is HTTPS only); without, SSLRequest is answered 'N'.
import { createServer, type Server, type Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { Logger } from 'pino';
import type pg from 'pg';
import { BodyReader, MAX_STARTUP_BYTES, MessageReader, type Frame } from './wire/framing.ts';
import {
  authenticationCleartextPassword,
  authenticationOk,
  authenticationSasl,
  authenticationSaslContinue,
  authenticationSaslFinal,
  backendKeyData,
  errorResponse,
  negotiateProtocolVersion,
  parameterStatus,
  readyForQuery,
  type ErrorFields,
} from './wire/backend.ts';
import {
  CLIENT_TIMEOUTS,
  FENCE_SETTINGS,
  OWN_SETTINGS,
  applicationName,
  boundedTimeout,
  requestedSettings,
  type ClientTimeout,
} from './startup.ts';
import { negotiatesEncryption, parseStartupPacket } from './wire/frontend.ts';
import { MECHANISM, ScramError, ScramServer, mockScramSecret } from '../access/scram.ts';
import { BackendStartupError, backendTarget, cancelBackend, openBackend, type Backend, type BackendTarget } from './backend.ts';
import type { DurabilityMonitor } from '../../fence/durability-monitor.ts';
import { PgwireSession, type SessionGuard, type StaleRefusal } from './session.ts';
import { raisedAbove, raiseFences } from '../../fence/raise.ts';
import { digestOf, type AccessKey } from '../access/keys.ts';
import type { TlsMaterial } from '../access/tls.ts';
import { resetClientPassword, type ProvisionResult } from '../../fence/client-logins.ts';
import type { AcceptedCounts } from '../../fence/accepted-counts.ts';
import type { RejectionLog } from '../../fence/rejection-log.ts';
import type { ProxyMetrics } from '../metrics.ts';
import type { StaleDigest } from '../../logging/stale-digest.ts';
import {
  CONNECTION_FAILURE,
  INVALID_AUTHORIZATION_SPECIFICATION,
  INVALID_CATALOG_NAME,
  INVALID_PASSWORD,
  PROTOCOL_VIOLATION,
  SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
  TOO_MANY_CONNECTIONS,
} from '../../fence/sqlstate.ts';

export interface PgwireOptions {
  host: string;
  /** 0: any free port (tests). */
  port: number;
  /** DATABASE_URL: the backend server and the one database the endpoint serves. */
  databaseUrl: string;
  /** Empty: open mode. */
  keys: readonly AccessKey[];
  /** The client logins and the fence capability (TransactionRunner.provision, memoised). */
  provision: () => Promise<ProvisionResult>;
  /** The proxy's own pool: resetting a client login's password. */
  owner: pg.Pool;
  /** Where a refused transaction is recorded (door `sql`): the store's log. */
  rejections: RejectionLog;
  /** Where a committed fenced transaction is counted (the store's, src/fence/accepted-counts.ts); absent: not counted. */
  accepted?: AcceptedCounts;
  /** Where the door's transactions and refusals are counted (fencepost_writes_total{door="sql"}); absent: nowhere. */
  metrics?: ProxyMetrics;
  /** Where refusals are logged, summed per interval (the app's staleLog); absent: a line each. */
  staleLog?: StaleDigest;
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  /** A raise waits this long for older tokens' transactions, then ends them (src/fence/raise.ts). */
  raiseWaitMs: number;
  /** A session's transaction left idle this long is ended (0: never). */
  idleInTransactionMs: number;
  /** Sessions one key (open mode: everyone) may hold at once. */
  maxSessionsPerKey: number;
  /** Connections still in startup (not yet authenticated) from one address at once. */
  maxStartupsPerAddress: number;
  maxConnections: number;
  /** Startup (packet, authentication, backend login) must finish within this. */
  startupTimeoutMs: number;
  logger: Logger;
  /** The token forgery guard (FENCEPOST_FORGERY_GUARD); null or absent: none. */
  guard?: SessionGuard | null;
  /** Writes refused while a failover could lose a fence raise (src/fence/durability-monitor.ts); null or absent: never. */
  durability?: DurabilityMonitor | null;
  /** The proxy's TLS material: SSLRequest is answered 'S' and TLS is required; null = 'N', plain TCP. */
  tls?: TlsMaterial | null;
}

/** A connection silent this long may be closed to make room for a new one from its address. */
const SILENT_EVICTION_MS = 1000;

class Refusal extends Error {
  constructor(readonly fields: ErrorFields) {
    super(fields.message);
  }
}

const refuse = (code: string, msg: string, detail?: string): Refusal =>
  new Refusal({ severity: 'FATAL', code, message: msg, ...(detail !== undefined ? { detail } : {}) });

/** The client sent Terminate during authentication: it is gone, nothing to answer. */
class ClientLeft extends Error {}

/** The most bytes of a password or SASL message (a SCRAM message is a few hundred). */
const MAX_AUTH_MESSAGE_BYTES = 8192;

/** An authentication message ('p'), or a refusal; Terminate ends the startup quietly. */
function authMessage(f: Frame, expected: string): Frame {
  if (f.type === 'X') throw new ClientLeft('the client terminated during authentication');
  if (f.type !== 'p') throw refuse(PROTOCOL_VIOLATION, `expected ${expected}, got message type ${JSON.stringify(f.type)}`);
  return f;
}

interface Registered {
  secret: Buffer;
  backend: Backend;
}

/**
 * The backend's ParameterStatus messages as the writer should read them. The backend's
 * default_transaction_read_only is always on (the backstop for a transaction that would escape
 * the fence), but a session with a token writes: each of its transactions is fenced and made
 * read-write. Drivers decide from this report whether a server takes writes (libpq's
 * target_session_attrs=read-write, …), so it says `off` for a session that starts with a token
 * and `on` for one without. Later changes come from the backend as they happen.
 */
function writerView(status: readonly Buffer[], writes: boolean): Buffer[] {
  return status.map((b) =>
    b.subarray(5, b.indexOf(0, 5)).toString('latin1') === 'default_transaction_read_only'
      ? parameterStatus('default_transaction_read_only', writes ? 'off' : 'on')
      : b,
  );
}

export class PgwireServer {
  private readonly server: Server;
  private readonly target: BackendTarget;
  private readonly sockets = new Set<Socket>();
  /** The TLS socket over each upgraded raw socket. */
  private readonly upgraded = new WeakMap<Socket, TLSSocket>();
  /**
   * Sessions by their backend's pid, which BackendKeyData tells the writer (so it agrees with
   * pg_backend_pid() and NOTIFY); a list, since backends on different hosts may share a pid.
   */
  private readonly sessions = new Map<number, Registered[]>();
  private sessionCount = 0;
  /** Sessions (and logins under way) per key name ('' in open mode). */
  private readonly perKey = new Map<string, number>();
  /** Connections per remote address that have sent nothing yet, with when each came. */
  private readonly silent = new Map<string, Map<Socket, number>>();
  /** Keys the made-up SCRAM salts of unknown users: stable for the process, as the keys' own salts are. */
  private readonly mockNonce = randomBytes(32);

  constructor(private readonly opts: PgwireOptions) {
    this.target = backendTarget(opts.databaseUrl);
    this.server = createServer((socket) => this.accept(socket));
    this.server.maxConnections = opts.maxConnections * 2; // hard cap; the polite refusal is below
  }

  async listen(): Promise<number> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.opts.port, this.opts.host, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    const address = this.server.address();
    return typeof address === 'object' && address ? address.port : this.opts.port;
  }

  /** Stops accepting and closes every session (their open transactions roll back). */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) {
      this.upgraded.get(s)?.destroy();
      s.destroy();
    }
    await closed;
  }

  get connections(): number {
    return this.sockets.size;
  }

  private accept(socket: Socket): void {
    socket.setNoDelay(true);
    socket.on('error', () => {});
    // Sessions count against FENCEPOST_PGWIRE_MAX_CONNECTIONS; connections that have sent nothing
    // yet do not. Those are bounded per address instead: past FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS,
    // each new connection closes the oldest one that has been silent for a second (a client that
    // means to log in sends its startup packet at once), so idle connections cannot keep writers
    // out, and a burst of real logins (a pool warming up) is never refused for it.
    const address = socket.remoteAddress ?? '';
    const full = this.sessionCount >= this.opts.maxConnections || this.sockets.size >= this.server.maxConnections - 1;
    const silent = this.silent.get(address) ?? new Map<Socket, number>();
    this.silent.set(address, silent);
    if (silent.size >= this.opts.maxStartupsPerAddress) {
      const [oldest, at] = silent.entries().next().value as [Socket, number];
      if (Date.now() - at >= SILENT_EVICTION_MS) {
        silent.delete(oldest);
        this.opts.logger.info({ address }, 'SQL connection closed: silent since it connected, and its address has more waiting');
        oldest.end(
          errorResponse({
            severity: 'FATAL',
            code: TOO_MANY_CONNECTIONS,
            message: `too many silent connections from ${address} (FENCEPOST_PGWIRE_MAX_STARTUPS_PER_ADDRESS=${this.opts.maxStartupsPerAddress}): this one sent nothing`,
          }),
          () => oldest.destroy(),
        );
      }
    }
    silent.set(socket, Date.now());
    const spoke = () => {
      silent.delete(socket);
      if (silent.size === 0 && this.silent.get(address) === silent) this.silent.delete(address);
    };
    socket.once('data', spoke);
    this.sockets.add(socket);
    socket.on('close', () => {
      this.sockets.delete(socket);
      spoke();
    });
    // A full endpoint still answers the SSLRequest (and takes the TLS handshake) and refuses after
    // the startup packet, as Postgres does: libpq with sslmode=prefer (its default) shows an error
    // sent in answer to the SSLRequest as a failed TLS negotiation, not as 53300, and a refusal
    // before the first packet makes the client's write fail with a reset. Counted until closed,
    // so a flood of refusals is bounded too, and closed within two seconds.
    const refusal = full
      ? refuse(
          TOO_MANY_CONNECTIONS,
          `too many connections to the fencepost SQL endpoint (FENCEPOST_PGWIRE_MAX_CONNECTIONS=${this.opts.maxConnections})`,
        )
      : null;
    if (refusal !== null) {
      setTimeout(() => {
        this.upgraded.get(socket)?.destroy();
        socket.destroy();
      }, 2000).unref();
    }
    void this.startup(socket, refusal).catch((err: unknown) => {
      // Over TLS once upgraded: the refusal goes where the client reads.
      // Closed once the refusal is written: the socket may be paused with bytes unread (an
      // oversized message), so the client's own close would never be seen.
      const conn = this.upgraded.get(socket) ?? socket;
      const close = (fields: ErrorFields) => {
        if (!conn.destroyed) conn.end(errorResponse(fields), () => conn.destroy());
      };
      if (err instanceof ClientLeft) {
        conn.destroy();
      } else if (err instanceof Refusal) {
        this.opts.logger.info({ code: err.fields.code }, `SQL connection refused: ${err.fields.message}`);
        close(err.fields);
      } else {
        this.opts.logger.warn({ err }, 'SQL connection failed during startup');
        close({ severity: 'FATAL', code: CONNECTION_FAILURE, message: 'the fencepost SQL endpoint could not start the session' });
      }
    });
  }

  /** Runs the startup phase; `refusal` (a full endpoint): answered once the startup packet is in. */
  private async startup(raw: Socket, refusal: Refusal | null): Promise<void> {
    let socket: Socket = raw;
    const reader = new MessageReader(true);
    // The startup phase reads one message at a time: the socket is paused while a framed message
    // waits to be taken (and while the listener waits for the backend), so what a client sends
    // ahead (a Terminate in the same write as its startup packet, a pipelined query) stays in
    // `reader` for the session, and no more than one chunk past the awaited message is buffered.
    // Each message is bounded before it is buffered: a startup packet by MAX_STARTUP_BYTES (as
    // Postgres's), what follows it here (password and SASL messages) by MAX_AUTH_MESSAGE_BYTES;
    // a longer length is refused as soon as its header is in.
    let framed: Frame | null = null;
    let wake: (() => void) | null = null;
    let ended = false;
    let problem: Refusal | null = null;
    const pull = () => {
      if (framed !== null || problem !== null) return;
      const untyped = reader.startup;
      try {
        const f = reader.next(untyped ? MAX_STARTUP_BYTES : MAX_AUTH_MESSAGE_BYTES);
        if (f === null) return;
        // A StartupMessage (or CancelRequest) ends the untyped phase: what follows is typed.
        if (untyped && !negotiatesEncryption(f.body)) reader.startup = false;
        framed = f;
      } catch (err) {
        problem = refuse(
          PROTOCOL_VIOLATION,
          `${untyped ? 'invalid startup packet' : 'invalid authentication message'}: ${err instanceof Error ? err.message : String(err)}`,
        );
      }
    };
    const onData = (chunk: Buffer) => {
      reader.push(chunk);
      pull();
      if (framed !== null || problem !== null) socket.pause();
      wake?.();
    };
    const onEnd = () => {
      ended = true;
      wake?.();
    };
    socket.on('data', onData);
    socket.on('close', onEnd);
    const deadline = Date.now() + this.opts.startupTimeoutMs;
    const timer = setTimeout(onEnd, this.opts.startupTimeoutMs);
    const nextFrame = async (): Promise<Frame> => {
      for (;;) {
        pull();
        if (problem !== null) throw problem;
        const f = framed;
        if (f !== null) {
          framed = null;
          return f;
        }
        if (ended || Date.now() >= deadline) throw refuse(CONNECTION_FAILURE, 'startup did not finish in time or the client went away');
        socket.resume();
        await new Promise<void>((resolve) => (wake = resolve));
        wake = null;
      }
    };
    try {
      let packet;
      let encrypted = false;
      for (;;) {
        packet = parseStartupPacket((await nextFrame()).body);
        if ((packet.kind === 'ssl' || packet.kind === 'gssenc') && encrypted)
          throw refuse(PROTOCOL_VIOLATION, 'a second encryption request on an encrypted connection');
        if (packet.kind === 'ssl' && this.opts.tls) {
          // Nothing may follow the SSLRequest before the handshake: such bytes were sent in the
          // clear, and must not be read as if they came over TLS.
          if (reader.pending > 0 || framed !== null) throw refuse(PROTOCOL_VIOLATION, 'received unencrypted data after SSL request');
          socket.off('data', onData);
          socket.off('close', onEnd);
          socket.resume(); // the TLS socket reads the raw one from here
          socket.write('S');
          const secure = new TLSSocket(socket, { isServer: true, secureContext: this.opts.tls.current() });
          secure.on('error', () => {}); // a failed handshake closes it: 'close' ends the startup
          secure.setNoDelay(true);
          this.upgraded.set(raw, secure);
          socket = secure;
          socket.on('data', onData);
          socket.on('close', onEnd);
          encrypted = true;
          continue;
        }
        if (packet.kind === 'ssl' || packet.kind === 'gssenc') {
          socket.write('N');
          continue;
        }
        break;
      }
      if (packet.kind === 'cancel') {
        await this.cancel(packet.pid, packet.secret);
        socket.end(() => socket.destroy());
        return;
      }
      if (refusal !== null) throw refusal;
      if (this.opts.tls && !encrypted) {
        throw refuse(
          INVALID_AUTHORIZATION_SPECIFICATION,
          'the fencepost SQL endpoint requires TLS',
          'FENCEPOST_TLS_CERT is set: connect with sslmode=require (or verify-full), or ssl in the driver',
        );
      }
      const params = packet.params;
      const unsupported = [...params.keys()].filter((k) => k.startsWith('_pq_.'));
      if (packet.minor !== 0 || unsupported.length > 0) socket.write(negotiateProtocolVersion(unsupported));
      const user = params.get('user');
      if (!user) throw refuse(INVALID_AUTHORIZATION_SPECIFICATION, 'no user name in the startup packet');
      if (params.has('replication') && params.get('replication') !== 'false')
        throw refuse(PROTOCOL_VIOLATION, 'replication connections are not served by the fencepost SQL endpoint');
      const database = params.get('database') || user;
      if (database !== this.target.database) {
        throw refuse(
          INVALID_CATALOG_NAME,
          `database ${JSON.stringify(database)} does not exist`,
          `this fencepost SQL endpoint serves database ${JSON.stringify(this.target.database)}`,
        );
      }
      // ---- authentication
      let key: AccessKey | null = null;
      if (this.opts.keys.length > 0) {
        key = this.opts.keys.find((k) => k.name === user) ?? null;
        if (!encrypted && key !== null && key.scram === undefined) {
          // SCRAM needs the secret's salted keys, which a secretSha256 key does not keep: its
          // password can only be sent as is, so only inside TLS. Say so, not "password failed".
          throw refuse(
            INVALID_AUTHORIZATION_SPECIFICATION,
            `key ${JSON.stringify(user)} can log in to the SQL endpoint over TLS only: it keeps only secretSha256, which SCRAM cannot use`,
            'Serve TLS (FENCEPOST_TLS_CERT, FENCEPOST_TLS_KEY) and connect with sslmode=require, or give the key a plain `secret` (SCRAM).',
          );
        }
        if (encrypted && key !== null && key.scram === undefined) {
          // A secretSha256 key has no SCRAM keys: over TLS only, the password itself.
          socket.write(authenticationCleartextPassword());
          const pw = authMessage(await nextFrame(), 'a password message');
          let given = '';
          try {
            given = new BodyReader(pw.body).cstring();
          } catch {
            throw refuse(PROTOCOL_VIOLATION, 'malformed password message');
          }
          if (!timingSafeEqual(digestOf(given), key.digest))
            throw refuse(INVALID_PASSWORD, `password authentication failed for user ${JSON.stringify(user)}`);
        } else {
          const server = new ScramServer(key?.scram ?? mockScramSecret(this.mockNonce, user), key?.scram !== undefined);
          socket.write(authenticationSasl(MECHANISM));
          try {
            const first = authMessage(await nextFrame(), 'a SASL response');
            const r = new BodyReader(first.body);
            const mechanism = r.cstring();
            if (mechanism !== MECHANISM)
              throw refuse(INVALID_AUTHORIZATION_SPECIFICATION, `authentication method ${mechanism} is not supported (use ${MECHANISM})`);
            const len = r.int32();
            const clientFirst = r.bytes(Math.max(0, len)).toString('utf8');
            socket.write(authenticationSaslContinue(server.first(clientFirst)));
            const fin = authMessage(await nextFrame(), 'a SASL response');
            const serverFinal = server.final(fin.body.toString('utf8'));
            socket.write(authenticationSaslFinal(serverFinal));
          } catch (err) {
            if (err instanceof Refusal || err instanceof ClientLeft) throw err;
            if (err instanceof ScramError && /channel binding|malformed/.test(err.message))
              throw refuse(INVALID_AUTHORIZATION_SPECIFICATION, err.message);
            throw refuse(INVALID_PASSWORD, `password authentication failed for user ${JSON.stringify(user)}`);
          }
        }
        if (key === null) throw refuse(INVALID_PASSWORD, `password authentication failed for user ${JSON.stringify(user)}`);
      }
      // ---- the backend, as the key's client login
      const { logins, problems, capability } = await this.opts.provision();
      const login = logins.get(key?.name ?? null);
      if (!login) {
        const problem = problems.get(key?.name ?? null);
        throw refuse(
          INVALID_AUTHORIZATION_SPECIFICATION,
          key !== null && key.pgRole === null
            ? `key ${key.name} has no pgRole: SQL sessions run as the key's Postgres role`
            : `no client login for ${key === null ? 'open mode' : `key ${key.name}`}${problem ? `: ${problem.message}` : ''}`,
        );
      }
      // ---- the key's share of the endpoint
      const keyName = key?.name ?? '';
      const held = this.perKey.get(keyName) ?? 0;
      if (held >= this.opts.maxSessionsPerKey) {
        throw refuse(
          TOO_MANY_CONNECTIONS,
          `${key === null ? 'open mode' : `key ${key.name}`} has ${held} SQL sessions open (FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY=${this.opts.maxSessionsPerKey})`,
        );
      }
      this.perKey.set(keyName, held + 1);
      let counted = true;
      const uncount = () => {
        if (!counted) return;
        counted = false;
        const n = (this.perKey.get(keyName) ?? 1) - 1;
        if (n <= 0) this.perKey.delete(keyName);
        else this.perKey.set(keyName, n);
      };
      raw.once('close', uncount);
      const settings = new Map<string, string>([['default_transaction_read_only', 'on']]);
      if (login.pgRole !== null) settings.set('role', login.pgRole);
      const requested = requestedSettings(params);
      // The fence's settings, from `options` or a startup parameter of the driver's own (asyncpg
      // server_settings, pgx RuntimeParams): the gate reads them back from the backend.
      for (const [k, v] of requested) if (FENCE_SETTINGS.has(k)) settings.set(k, v);
      // The proxy's own bound on each (it sets no idle_in_transaction_session_timeout of its own).
      const own: Record<ClientTimeout, number | null> = {
        statement_timeout: this.opts.statementTimeoutMs,
        lock_timeout: this.opts.lockTimeoutMs,
        idle_in_transaction_session_timeout: null,
      };
      for (const name of CLIENT_TIMEOUTS) {
        const ms = boundedTimeout(requested.get(name), own[name]);
        if (ms !== null) settings.set(name, String(ms));
      }
      const forwarded = new Map<string, string>();
      for (const [k, v] of requested) if (!OWN_SETTINGS.has(k) && !FENCE_SETTINGS.has(k) && !k.startsWith('_pq_.')) forwarded.set(k, v);
      forwarded.set('application_name', applicationName(requested));
      const backendLogin = { user: login.login, password: login.password, parameters: forwarded, settings };
      const remaining = () => Math.max(1, deadline - Date.now());
      let backend: Backend;
      try {
        backend = await openBackend(this.target, backendLogin, remaining());
      } catch (err) {
        if (!(err instanceof BackendStartupError) || err.code !== INVALID_PASSWORD) throw this.backendRefusal(err);
        // A statement of this login may have changed its own password: set it back once.
        await resetClientPassword(this.opts.owner, login);
        try {
          backend = await openBackend(this.target, backendLogin, remaining());
        } catch (again) {
          throw this.backendRefusal(again);
        }
      }
      if (socket.destroyed) {
        backend.socket.destroy();
        return;
      }
      // ---- ready
      // The backend's own pid (with a secret of the proxy's: a cancel comes to the proxy).
      const pid = backend.pid;
      const secret = randomBytes(4);
      const registered: Registered = { secret, backend };
      this.sessions.set(pid, [...(this.sessions.get(pid) ?? []), registered]);
      this.sessionCount++;
      const writerId = user;
      const logger = this.opts.logger.child({ component: 'pgwire', writerId, keyName: key?.name ?? null });
      const writes = (settings.get('fencepost.token') ?? '') !== '';
      // What the writer is told is what the relay compares later ParameterStatus messages with.
      backend.parameterStatus = writerView(backend.parameterStatus, writes);
      // Held (corked) until the session is fenced for its startup settings: the writer's
      // ReadyForQuery says the session is ready to write (session.ts onStartupFenced).
      socket.cork();
      socket.write(
        Buffer.concat([authenticationOk(), ...backend.parameterStatus, backendKeyData(pid, secret.readInt32BE(0)), readyForQuery('I')]),
      );
      socket.off('data', onData);
      socket.off('close', onEnd);
      clearTimeout(timer);
      socket.resume(); // flows from the session's own 'data' listener, attached before the next tick
      const session = new PgwireSession(socket, reader, backend, {
        logger,
        capability,
        prefixes: key === null ? null : key.readOnly ? [] : key.fenceKeyPrefixes,
        writerId,
        guard: this.opts.guard ?? null,
        startupSettings: { token: settings.get('fencepost.token') ?? null, fenceKey: settings.get('fencepost.fence_key') ?? null },
        raisedAbove: (fenceKey, token, waitMs) => raisedAbove(this.opts.owner, fenceKey, token, waitMs),
        raiseCommitMs: this.opts.lockTimeoutMs,
        idleInTransactionMs: this.opts.idleInTransactionMs,
        raise: async (fenceKey, token) => {
          await raiseFences(this.opts.owner, [{ fenceKey, token }], writerId, {
            waitMs: this.opts.raiseWaitMs,
            lockTimeoutMs: this.opts.lockTimeoutMs,
            logger,
          });
        },
        onStale: (s) => this.recordStale(s, writerId, logger),
        onTransactionEnd: (end, fenceKey) => {
          this.opts.metrics?.countWrite('sql', 'transaction', end);
          if (end === 'accepted') this.opts.accepted?.add([fenceKey]);
        },
        onFenceError: (outcome) => this.opts.metrics?.countWrite('sql', 'transaction', outcome),
        onStartupFenced: () => socket.uncork(),
        durability: this.opts.durability ?? null,
        onClose: () => {
          const all = this.sessions.get(pid) ?? [];
          if (!all.includes(registered)) return;
          const left = all.filter((r) => r !== registered);
          if (left.length > 0) this.sessions.set(pid, left);
          else this.sessions.delete(pid);
          this.sessionCount--;
        },
      });
      session.start();
      logger.debug('SQL session started');
    } finally {
      socket.off('data', onData);
      socket.off('close', onEnd);
      clearTimeout(timer);
    }
  }

  private backendRefusal(err: unknown): Refusal {
    // DATABASE_URL lists several hosts and none takes writes now: the reason names each.
    if (err instanceof BackendStartupError && err.code === SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION)
      return refuse(SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, `cannot reach a writable database: ${err.message}`);
    if (err instanceof BackendStartupError)
      return refuse(
        err.code === INVALID_PASSWORD ? INVALID_AUTHORIZATION_SPECIFICATION : err.code,
        `the database refused the session's login: ${err.message}`,
      );
    return refuse(CONNECTION_FAILURE, `cannot reach the database: ${err instanceof Error ? err.message : String(err)}`);
  }

  /** Forwards a cancel to the session's backend; resolves once Postgres has taken it (cancelBackend). */
  private async cancel(pid: number, secret: Buffer): Promise<void> {
    const s = (this.sessions.get(pid) ?? []).find((r) => r.secret.length === secret.length && timingSafeEqual(r.secret, secret));
    if (!s) return;
    await cancelBackend(s.backend.target, s.backend.pid, s.backend.secret); // the host it runs on (of several)
  }

  private recordStale(s: StaleRefusal, writerId: string, logger: Logger): void {
    this.opts.metrics?.countSqlRejection('stale_token');
    if (this.opts.staleLog)
      this.opts.staleLog.note({ door: 'sql', fenceKey: s.fenceKey, token: s.token, highestToken: s.highestToken, writerId }, logger);
    else
      logger.info(
        { fenceKey: s.fenceKey, token: s.token.toString(), highestToken: s.highestToken?.toString() ?? null },
        'stale token refused (SQL endpoint)',
      );
    this.opts.rejections.recordInBackground('sql', [{ kind: 'transaction', fenceKey: s.fenceKey, key: null, token: s.token, writerId }]);
  }
}
