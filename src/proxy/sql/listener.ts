// The SQL endpoint's listener: accepts PostgreSQL protocol connections, runs the startup phase
// (SSLRequest, CancelRequest, StartupMessage, authentication), opens the session's backend
// connection as the key's client login, and hands over to SqlSession.
//
// Authentication: authenticate.ts; the startup phase's connection (framing, limits, deadline, the
// TLS upgrade): startup-channel.ts; the backend's settings: startup.ts.
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
import type { TLSSocket } from 'node:tls';
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { Logger } from 'pino';
import {
  authenticationOk,
  backendKeyData,
  errorResponse,
  negotiateProtocolVersion,
  readyForQuery,
  type ErrorFields,
} from './wire/backend.ts';
import { parseStartupPacket } from './wire/frontend.ts';
import { backendSettings } from './startup.ts';
import { ClientLeft, Refusal, refuse, StartupChannel } from './startup-channel.ts';
import { authenticate } from './authenticate.ts';
import { BackendStartupError, backendTarget, cancelBackend, openBackend, type Backend, type BackendTarget } from './backend.ts';
import { type Fence, type SessionGuard, SQLSTATE } from '../../fence/index.ts';
import { type DurabilityMonitor } from '../../fence/admin.ts';
import { SqlSession, type StaleRefusal } from './session.ts';
import { SpareBackends, startupIdentity } from './spares.ts';
import { PGWIRE_DEFAULTS } from '../config.ts';
import { withinPrefixes, type AccessKey } from '../access/keys.ts';
import type { TlsMaterial } from '../access/tls.ts';
import type { ProxyMetrics } from '../metrics.ts';
import type { StaleDigest } from '../../logging/stale-digest.ts';

export interface SqlEndpointOptions {
  host: string;
  /** 0: any free port (tests). */
  port: number;
  /** DATABASE_URL: the backend server and the one database the endpoint serves. */
  databaseUrl: string;
  /** Empty: open mode. */
  keys: readonly AccessKey[];
  /**
   * The proxy's fence (src/fence/fence.ts, one for every door): the client logins and the fence
   * capability, raises, where refused transactions are recorded (door `sql`) and committed ones counted.
   */
  fence: Fence;
  /** Where the door's transactions and refusals are counted (fencepost_writes_total{door="sql"}); absent: nowhere. */
  metrics?: ProxyMetrics;
  /** Where refusals are logged, summed per interval (every door's, shared.ts); absent: a line each. */
  staleLog?: StaleDigest;
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  /** A session's transaction left idle this long is ended (0: never). */
  idleInTransactionMs: number;
  /** Sessions one key (open mode: everyone) may hold at once. */
  maxSessionsPerKey: number;
  /** Connections still in startup (not yet authenticated) from one address at once. */
  maxStartupsPerAddress: number;
  maxConnections: number;
  /**
   * Backends logged in and warmed ahead of the next connect with the same startup (spares.ts),
   * counted within maxConnections; absent or 0: none.
   */
  spareBackends?: number;
  /** How long an untaken spare is kept (default PGWIRE_DEFAULTS.spareKeepMs). */
  spareKeepMs?: number;
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

interface Registered {
  secret: Buffer;
  backend: Backend;
}

export class SqlEndpoint {
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
  private readonly spares: SpareBackends;

  constructor(private readonly opts: SqlEndpointOptions) {
    this.target = backendTarget(opts.databaseUrl);
    this.spares = new SpareBackends({
      // Several hosts: a spare could outlive a failover on the old primary.
      max: this.target.follow ? 0 : (opts.spareBackends ?? 0),
      keepMs: opts.spareKeepMs ?? PGWIRE_DEFAULTS.spareKeepMs,
      timeoutMs: opts.startupTimeoutMs,
      fence: opts.fence,
      logger: opts.logger,
    });
    this.server = createServer((socket) => this.accept(socket));
    this.server.maxConnections = opts.maxConnections * 2; // hard cap; the polite refusal is below
  }

  /** Listens on `port` (default: the configured one; again after a failed listen, e.g. another port); the port bound. */
  async listen(port: number = this.opts.port): Promise<number> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, this.opts.host, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    const address = this.server.address();
    return typeof address === 'object' && address ? address.port : port;
  }

  /** Stops accepting and closes every session (their open transactions roll back). */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.spares.close();
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
            code: SQLSTATE.TOO_MANY_CONNECTIONS,
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
          SQLSTATE.TOO_MANY_CONNECTIONS,
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
        close({ severity: 'FATAL', code: SQLSTATE.CONNECTION_FAILURE, message: 'the fencepost SQL endpoint could not start the session' });
      }
    });
  }

  /** Runs the startup phase; `refusal` (a full endpoint): answered once the startup packet is in. */
  private async startup(raw: Socket, refusal: Refusal | null): Promise<void> {
    const channel = new StartupChannel(raw, this.opts.startupTimeoutMs);
    try {
      const packet = await this.negotiate(raw, channel);
      if (packet === null) return; // a cancel request, served
      if (refusal !== null) throw refusal;
      const params = packet.params;
      const user = this.checkStartup(channel, packet);
      const key = await authenticate(channel, this.opts.keys, user, this.mockNonce);
      const { login, problem, capability } = await this.opts.fence.loginFor(key?.name ?? null);
      if (!login) {
        throw refuse(
          SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
          key !== null && key.pgRole === null
            ? `key ${key.name} has no pgRole: SQL sessions run as the key's Postgres role`
            : `no client login for ${key === null ? 'open mode' : `key ${key.name}`}${problem ? `: ${problem.message}` : ''}`,
        );
      }
      this.takeKeyShare(raw, key);
      const { settings, forwarded } = backendSettings(params, login.pgRole, this.opts);
      const backendLogin = { user: login.login, password: login.password, parameters: forwarded, settings };
      const startup = startupIdentity(login.login, forwarded, settings);
      let backend = this.spares.take(startup);
      if (backend === null) {
        try {
          backend = await this.opts.fence.connectAs(login, () => openBackend(this.target, backendLogin, channel.remaining()));
        } catch (err) {
          throw this.backendRefusal(err);
        }
      }
      // The next connect like this one finds a backend logged in and warmed (within the budget).
      if (this.sessionCount + this.spares.size + 1 < this.opts.maxConnections)
        this.spares.replenish(startup, capability, () =>
          this.opts.fence.connectAs(login, () => openBackend(this.target, backendLogin, this.opts.startupTimeoutMs)),
        );
      const socket = channel.socket;
      if (socket.destroyed) {
        backend.socket.destroy();
        return;
      }
      channel.release();
      this.startSession(socket, channel, backend, {
        writerId: user,
        key,
        capability,
        token: settings.get('fencepost.token') ?? null,
        fenceKey: settings.get('fencepost.fence_key') ?? null,
      });
    } finally {
      channel.release();
    }
  }

  /**
   * The startup packet, after any encryption requests (TLS when the proxy has it, else 'N'), or
   * null for a cancel request (forwarded, then the connection closes).
   */
  private async negotiate(raw: Socket, channel: StartupChannel): Promise<{ minor: number; params: Map<string, string> } | null> {
    for (;;) {
      const packet = parseStartupPacket((await channel.next()).body);
      if ((packet.kind === 'ssl' || packet.kind === 'gssenc') && channel.encrypted)
        throw refuse(SQLSTATE.PROTOCOL_VIOLATION, 'a second encryption request on an encrypted connection');
      if (packet.kind === 'ssl' && this.opts.tls) {
        this.upgraded.set(raw, channel.upgrade(this.opts.tls.current()));
        continue;
      }
      if (packet.kind === 'ssl' || packet.kind === 'gssenc') {
        channel.socket.write('N');
        continue;
      }
      if (packet.kind === 'cancel') {
        await this.cancel(packet.pid, packet.secret);
        const socket = channel.socket;
        socket.end(() => socket.destroy());
        return null;
      }
      return packet;
    }
  }

  /**
   * The user name of a startup packet the endpoint serves: TLS when required, protocol 3.0 (a later
   * minor version or `_pq_.` options are answered with NegotiateProtocolVersion), a user, no
   * replication, its database.
   */
  private checkStartup(channel: StartupChannel, packet: { minor: number; params: ReadonlyMap<string, string> }): string {
    if (this.opts.tls && !channel.encrypted) {
      throw refuse(
        SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
        'the fencepost SQL endpoint requires TLS',
        'FENCEPOST_TLS_CERT is set: connect with sslmode=require (or verify-full), or ssl in the driver',
      );
    }
    const params = packet.params;
    const unsupported = [...params.keys()].filter((k) => k.startsWith('_pq_.'));
    if (packet.minor !== 0 || unsupported.length > 0) channel.socket.write(negotiateProtocolVersion(unsupported));
    const user = params.get('user');
    if (!user) throw refuse(SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION, 'no user name in the startup packet');
    if (params.has('replication') && params.get('replication') !== 'false')
      throw refuse(SQLSTATE.PROTOCOL_VIOLATION, 'replication connections are not served by the fencepost SQL endpoint');
    const database = params.get('database') || user;
    if (database !== this.target.database) {
      throw refuse(
        SQLSTATE.INVALID_CATALOG_NAME,
        `database ${JSON.stringify(database)} does not exist`,
        `this fencepost SQL endpoint serves database ${JSON.stringify(this.target.database)}`,
      );
    }
    return user;
  }

  /** Counts a session against its key's share (FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY) until `raw` closes; a refusal when full. */
  private takeKeyShare(raw: Socket, key: AccessKey | null): void {
    const keyName = key?.name ?? '';
    const held = this.perKey.get(keyName) ?? 0;
    if (held >= this.opts.maxSessionsPerKey) {
      throw refuse(
        SQLSTATE.TOO_MANY_CONNECTIONS,
        `${key === null ? 'open mode' : `key ${key.name}`} has ${held} SQL sessions open (FENCEPOST_PGWIRE_MAX_SESSIONS_PER_KEY=${this.opts.maxSessionsPerKey})`,
      );
    }
    this.perKey.set(keyName, held + 1);
    raw.once('close', () => {
      const n = (this.perKey.get(keyName) ?? 1) - 1;
      if (n <= 0) this.perKey.delete(keyName);
      else this.perKey.set(keyName, n);
    });
  }

  /** The writer is logged in and its backend open: tell it so, register the session for cancels, and hand over. */
  private startSession(
    socket: Socket,
    channel: StartupChannel,
    backend: Backend,
    who: { writerId: string; key: AccessKey | null; capability: string; token: string | null; fenceKey: string | null },
  ): void {
    const { writerId, key } = who;
    // The backend's own pid (with a secret of the proxy's: a cancel comes to the proxy).
    const pid = backend.pid;
    const secret = randomBytes(4);
    const registered: Registered = { secret, backend };
    this.sessions.set(pid, [...(this.sessions.get(pid) ?? []), registered]);
    this.sessionCount++;
    const logger = this.opts.logger.child({ component: 'pgwire', writerId, keyName: key?.name ?? null });
    // The writer's messages wait (in the socket) until the connection is fenced; the greeting
    // (AuthenticationOk … ReadyForQuery) goes out only then, so a refused connection is refused
    // at startup, as the driver shows a login's failure.
    socket.pause();
    const gone = () => backend.socket.destroy();
    socket.once('close', gone);
    const session = new SqlSession(socket, channel.reader, backend, {
      logger,
      fence: this.opts.fence,
      capability: who.capability,
      mayWrite: (fenceKey) => withinPrefixes(key === null ? null : key.readOnly ? [] : key.fenceKeyPrefixes, fenceKey),
      guard: this.opts.guard ?? null,
      startupSettings: { token: who.token, fenceKey: who.fenceKey },
      writerId,
      raiseCommitMs: this.opts.fence.lockTimeoutMs,
      fenceTimeoutMs: this.opts.startupTimeoutMs,
      onStale: (s) => this.recordStale(s, writerId, logger),
      onTransactionEnd: (end, fenceKey) => {
        this.opts.metrics?.countSqlTransaction(end);
        if (end === 'accepted') this.opts.fence.countAccepted(fenceKey);
      },
      onFenceError: (outcome) => this.opts.metrics?.countSqlTransaction(outcome),
      ready: () => {
        socket.off('close', gone);
        socket.write(
          Buffer.concat([authenticationOk(), ...backend.parameterStatus, backendKeyData(pid, secret.readInt32BE(0)), readyForQuery('I')]),
        );
      },
      durability: this.opts.durability ?? null,
      onClose: () => {
        socket.off('close', gone);
        const all = this.sessions.get(pid) ?? [];
        if (!all.includes(registered)) return;
        const left = all.filter((r) => r !== registered);
        if (left.length > 0) this.sessions.set(pid, left);
        else this.sessions.delete(pid);
        this.sessionCount--;
      },
    });
    void session.start();
    logger.debug('SQL session started');
  }

  private backendRefusal(err: unknown): Refusal {
    // DATABASE_URL lists several hosts and none takes writes now: the reason names each.
    if (err instanceof BackendStartupError && err.code === SQLSTATE.SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION)
      return refuse(SQLSTATE.SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, `cannot reach a writable database: ${err.message}`);
    if (err instanceof BackendStartupError)
      return refuse(
        err.code === SQLSTATE.INVALID_PASSWORD ? SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION : err.code,
        `the database refused the session's login: ${err.message}`,
      );
    return refuse(SQLSTATE.CONNECTION_FAILURE, `cannot reach the database: ${err instanceof Error ? err.message : String(err)}`);
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
    this.opts.fence.recordRefusals('sql', [{ kind: 'transaction', fenceKey: s.fenceKey, key: null, token: s.token, writerId }]);
  }
}
