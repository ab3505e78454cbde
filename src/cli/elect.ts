// `fencepost elect`: run a command only while elected leader, with its fencing token in the env.
//
//   fencepost elect --zk <connect> --path <election-path> [--id <name>] [--session-timeout-ms <n>]
//                   [--grace-ms <n>] [--policy suspend-is-lost|wait-for-expiry] [--advise] -- <command> [args…]
//
// Contract (scripts depend on it):
// - waits to be elected, then runs the command with FENCING_TOKEN (decimal), ELECTION_PATH, ELECTION_ID;
// - on leadership loss: SIGTERM to the child's process group, SIGKILL after the grace period; then waits
//   to be elected again and reruns it with the new token;
// - when the child exits on its own: leaves the election and exits with the child's code
//   (128 + signal number if it was killed by a signal);
// - SIGTERM/SIGINT: stops the child the same way, leaves the election, exits 128 + signal number;
//   started by npm (`npx fencepost elect`, an npm script), the death of the launcher counts as
//   SIGTERM: npm forwards SIGTERM to the shell it runs us under, which dies of it without passing it on;
// - if this process dies without stopping the child (SIGKILL, OOM killer), the child's process group
//   is killed by its guardian (guardian.ts) within ~500 ms, long before a standby can be elected;
// - with --zk-auth / ZK_AUTH, election nodes get ACLs nobody else can write (src/election/acl.ts);
// - with --status-port, serves /healthz, /leader (status-server.ts) and /metrics (election-metrics.ts);
// - logs state changes as JSON lines (pino) on stderr;
// - cannot start or go on for a reason the user can fix (a command that is not there or not
//   executable, checked before campaigning; ZooKeeper unreachable within ZK_CONNECT_WAIT_MS; the
//   status port taken; a fence advance that keeps failing): one line `fencepost elect: …` naming
//   the flag, exit 1.
// `--advise` measures this cluster and prints a session-timeout recommendation, then exits.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { parseArgs } from 'node:util';
import type { ParseArgsConfig } from 'node:util';
import { pino } from 'pino';
import type { Logger } from 'pino';
import {
  ZK_CONNECT_WAIT_MS,
  Election,
  type ElectionPolicy,
  formatAdvice,
  measureSessionTimeoutAdvice,
  parseDigestAuth,
  type DigestAuth,
  defaultCandidateId,
  electionPathProblem,
} from '../election/index.ts';
import { Guardian } from './guardian.ts';
import { startStatusServer, type StatusServer } from './status-server.ts';
import { PortRangeFullError, isPortTaken, portRange, type PortRange } from '../ports.ts';
import { ElectionMetrics } from './election-metrics.ts';
import { CommandFailure, firstLine } from './command-failure.ts';
import { commandProblem } from './resolve-command.ts';
import { advanceAtProxy, type ProxyFence } from './fence-advance.ts';

export const ELECT_USAGE = `usage: fencepost elect --zk <connect-string> --path <election-path> [--id <name>]
                      [--session-timeout-ms <n>] [--grace-ms <n>] [--policy suspend-is-lost|wait-for-expiry]
                      [--zk-auth <user:password>] [--status-port <n> [--status-host <addr>]]
                      [--advise] [--proxy <url> --fence-key <key>] -- <command> [args…]
  ZK_AUTH=<user:password> in the environment stands for --zk-auth (and keeps it out of ps).`;

/** Longest wait of the guardian between SIGTERM and SIGKILL of an orphaned command (see guardian.ts). */
const GUARDIAN_KILL_AFTER_MAX_MS = 500;
/** How long the start-up check of the session timeout measures (checkAdvice). */
const ADVICE_WINDOW_MS = 2000;
/** How often a process started by npm checks that its launcher is still there. */
const LAUNCHER_CHECK_MS = 100;

export const ELECT_OPTIONS = {
  zk: { type: 'string' },
  path: { type: 'string' },
  id: { type: 'string' },
  'session-timeout-ms': { type: 'string' },
  'grace-ms': { type: 'string' },
  policy: { type: 'string' },
  'zk-auth': { type: 'string' },
  'status-port': { type: 'string' },
  'status-host': { type: 'string' },
  advise: { type: 'boolean' },
  proxy: { type: 'string' },
  'fence-key': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

export interface ElectConfig {
  zk: string;
  path: string;
  id: string;
  sessionTimeoutMs: number;
  graceMs: number;
  policy: ElectionPolicy;
  /** Digest credentials for ZooKeeper (--zk-auth, else ZK_AUTH); null: election nodes are open to anyone. */
  auth: DigestAuth | null;
  /** Port of the status server (/healthz, /leader, /metrics); null: none. 0 picks a free port (logged). */
  statusPort: number | null;
  /** FENCEPOST_PORT_RANGE, where --status-port 0 picks from (read only then); null: the OS picks. */
  statusPortRange: PortRange | null;
  statusHost: string;
  advise: boolean;
  command: string[];
  /** --proxy and --fence-key: each term advances this fence at the proxy before its command starts (fence-advance.ts); null: no proxy. */
  fence: ProxyFence | null;
}

class UsageError extends Error {}

export function parseElectArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): ElectConfig {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: ELECT_OPTIONS, allowPositionals: true, strict: true, tokens: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const v = parsed.values as Record<string, string | boolean | undefined>;
  const str = (k: string): string | undefined => (typeof v[k] === 'string' ? (v[k] as string) : undefined);
  const int = (k: string, def: number, min: number): number => {
    const raw = str(k);
    if (raw === undefined) return def;
    if (!/^\d+$/.test(raw) || Number(raw) < min) throw new UsageError(`--${k} must be an integer ≥ ${min}, got ${JSON.stringify(raw)}`);
    return Number(raw);
  };
  const zk = str('zk');
  const path = str('path');
  const advise = v.advise === true;
  if (!zk) throw new UsageError('--zk <connect-string> is required');
  if (!advise && !path) throw new UsageError('--path <election-path> is required');
  const pathProblem = path === undefined ? null : electionPathProblem(path);
  if (pathProblem !== null) throw new UsageError(`--path ${pathProblem}, got ${JSON.stringify(path)}`);
  const policy = str('policy') ?? 'suspend-is-lost';
  if (policy !== 'suspend-is-lost' && policy !== 'wait-for-expiry') {
    throw new UsageError(`--policy must be suspend-is-lost or wait-for-expiry, got ${JSON.stringify(policy)}`);
  }
  if (!advise && parsed.positionals.length === 0) throw new UsageError('a command to run is required after --');
  // The command comes after `--`, so its own flags are never taken for elect's.
  const firstPositional = parsed.tokens.find((t) => t.kind === 'positional' || t.kind === 'option-terminator');
  if (firstPositional?.kind === 'positional') {
    throw new UsageError(`the command goes after --: fencepost elect … -- ${parsed.positionals.join(' ')}`);
  }
  const rawAuth = str('zk-auth') ?? (env.ZK_AUTH || undefined);
  let auth: DigestAuth | null = null;
  if (rawAuth !== undefined) {
    try {
      auth = parseDigestAuth(rawAuth);
    } catch (err) {
      throw new UsageError(`${str('zk-auth') !== undefined ? '--zk-auth' : 'ZK_AUTH'} ${(err as Error).message}`);
    }
  }
  const statusPort = str('status-port') === undefined ? null : int('status-port', 0, 0);
  if (statusPort !== null && statusPort > 65535) throw new UsageError(`--status-port must be a port number, got ${statusPort}`);
  if (statusPort === null && str('status-host') !== undefined) throw new UsageError('--status-host needs --status-port');
  const statusPortRange = statusPort === 0 ? portRange(env) : null; // a malformed one: ConfigError naming it
  // A usage error at start, not a failure every term.
  const proxy = str('proxy');
  const fenceKey = str('fence-key');
  if ((proxy === undefined) !== (fenceKey === undefined) || proxy === '' || fenceKey === '')
    throw new UsageError('--proxy <url> and --fence-key <key> go together');
  return {
    zk,
    path: path ?? '/',
    id: str('id') ?? defaultCandidateId(),
    sessionTimeoutMs: int('session-timeout-ms', 10_000, 1),
    graceMs: int('grace-ms', 10_000, 0),
    policy,
    auth,
    statusPort,
    statusPortRange,
    statusHost: str('status-host') ?? '0.0.0.0',
    advise,
    command: parsed.positionals,
    fence: proxy !== undefined && fenceKey !== undefined ? { proxy, fenceKey } : null,
  };
}

export async function electCommand(argv: string[]): Promise<number> {
  let config: ElectConfig;
  try {
    if (argv.includes('--help') || argv.includes('-h')) {
      process.stdout.write(ELECT_USAGE + '\n');
      return 0;
    }
    config = parseElectArgs(argv);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`fencepost elect: ${err.message}\n${ELECT_USAGE}\n`);
    return 2;
  }
  if (!config.advise) {
    // Before campaigning: a command that cannot start must not take a term (and its token).
    const problem = commandProblem(config.command[0]!);
    if (problem !== null) throw new CommandFailure('elect', `${problem}: nothing started, no election joined`);
  }
  if (config.advise) {
    const advice = await measureSessionTimeoutAdvice({ connect: config.zk, windowMs: 5000 });
    process.stdout.write(formatAdvice(advice, config.sessionTimeoutMs) + '\n');
    return 0;
  }
  const baseLog = pino({ base: { pid: process.pid } }, pino.destination({ fd: 2, sync: true }));
  return await new ElectRunner(config, baseLog).run();
}

/** One `fencepost elect` run: the election, the child of the current term, signal handling. */
class ElectRunner {
  private readonly election: Election;
  private readonly stop = new AbortController();
  private stopSignalName: NodeJS.Signals | null = null;
  /** Token of the term whose command is running (for /leader). */
  private runningToken: bigint | null = null;

  private readonly log: Logger;
  private readonly metrics: ElectionMetrics;

  constructor(
    private readonly config: ElectConfig,
    baseLog: Logger,
  ) {
    // The Election adds electionPath and candidateId to its own log lines; ours get them here.
    this.log = baseLog.child({ electionPath: config.path, candidateId: config.id });
    this.election = new Election({
      connect: config.zk,
      path: config.path,
      id: config.id,
      sessionTimeoutMs: config.sessionTimeoutMs,
      policy: config.policy,
      logger: baseLog,
      ...(config.auth ? { auth: config.auth } : {}),
    });
    this.metrics = new ElectionMetrics(this.election, { fenceAdvance: config.fence !== null });
  }

  async run(): Promise<number> {
    const onSignal = (sig: NodeJS.Signals): void => {
      if (this.stopSignalName) return;
      this.stopSignalName = sig;
      this.log.info({ signal: sig }, 'stopping');
      this.stop.abort();
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    const launcherWatch = this.watchLauncher(onSignal);
    this.election.on('connection', ({ state, sessionId, reason }) =>
      this.log.info({ state, zkSession: sessionId, reason }, 'connection state'),
    );
    let status: StatusServer | null = null;
    try {
      if (this.config.statusPort !== null) {
        try {
          status = await startStatusServer(this.config.statusHost, this.config.statusPort, this.config.statusPortRange, {
            electionPath: this.config.path,
            id: this.config.id,
            leadingToken: () => (this.runningToken !== null && this.election.token === this.runningToken ? this.runningToken : null),
            zookeeper: () => this.election.currentSession?.state ?? 'connecting',
            stopping: () => this.stopSignalName !== null,
            metrics: this.metrics,
          });
        } catch (err) {
          throw new CommandFailure(
            'elect',
            statusPortProblem(err, this.config.statusHost, this.config.statusPort, this.config.statusPortRange),
            {
              cause: err,
            },
          );
        }
        this.log.info({ host: this.config.statusHost, port: status.port }, 'status server listening (/healthz, /leader)');
      }
      try {
        await this.joinWithin(ZK_CONNECT_WAIT_MS);
      } catch (err) {
        if (this.stopSignalName) return this.signalExitCode();
        throw err;
      }
      void this.checkAdvice();
      return await this.loop();
    } finally {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
      clearInterval(launcherWatch);
      await this.election.close();
      await status?.close();
    }
  }

  /**
   * Joins the election, giving up after `waitMs` without a ZooKeeper session (the election keeps
   * retrying otherwise; close() in run()'s finally stops it).
   */
  private async joinWithin(waitMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const started = this.election.start();
    const gaveUp = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), waitMs)));
    try {
      const first = await Promise.race([started.then(() => 'joined' as const), gaveUp]);
      if (first === 'timeout') {
        started.catch(() => {}); // rejects once close() aborts it
        throw new CommandFailure('elect', `cannot reach ZooKeeper at ${this.config.zk} (--zk) within ${waitMs / 1000} s`);
      }
    } catch (err) {
      if (err instanceof CommandFailure) throw err;
      throw new CommandFailure('elect', `could not join the election at --path ${this.config.path}: ${firstLine(err)}`, { cause: err });
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Started by npm (npx, npm exec, npm run), we run under `sh -c`: npm forwards SIGTERM to that
   * shell, which dies of it without passing it on, and we would lead on, orphaned. So when the
   * process that started us goes away, we stop as on SIGTERM. (Elsewhere a parent may exit on
   * purpose, e.g. nohup or a daemonizing wrapper, so this applies only under npm.)
   */
  private watchLauncher(onSignal: (sig: NodeJS.Signals) => void): NodeJS.Timeout | undefined {
    if (process.env.npm_lifecycle_event === undefined || process.platform === 'win32') return undefined;
    const launcher = process.ppid;
    const timer = setInterval(() => {
      if (process.ppid === launcher) return;
      clearInterval(timer);
      this.log.warn({ launcherPid: launcher }, 'the process that started fencepost elect (npm) is gone: stopping as on SIGTERM');
      onSignal('SIGTERM');
    }, LAUNCHER_CHECK_MS);
    timer.unref();
    return timer;
  }

  private async loop(): Promise<number> {
    for (;;) {
      let token: bigint;
      try {
        token = await this.election.waitForLeadership(this.stop.signal);
      } catch (err) {
        if (this.stopSignalName) return this.signalExitCode();
        throw new CommandFailure('elect', `the election at --path ${this.config.path} stopped: ${firstLine(err)}`, { cause: err });
      }
      const termSignal = this.election.signal;
      if (termSignal.aborted || this.election.token !== token) continue;
      const termLog = this.log.child({ token: token.toString() });
      let extraEnv: Record<string, string> = {};
      if (this.config.fence !== null) {
        try {
          // Also aborted by SIGTERM/SIGINT: an advance that retries (proxy unreachable) must not outlive a stop.
          const signal = AbortSignal.any([termSignal, this.stop.signal]);
          extraEnv =
            (await advanceAtProxy(this.config.fence, { token, id: this.config.id, logger: termLog, metrics: this.metrics, signal })) ?? {};
        } catch (err) {
          if (err instanceof CommandFailure) {
            // One JSON line for the logs (no stack: the message is the cause); main prints it once more, alone.
            termLog.error({ reason: err.message }, 'cannot lead: leaving the election');
            throw err;
          }
          termLog.error({ err }, 'the fence advance failed; resigning this term');
          await this.election.resign();
          continue;
        }
        if (termSignal.aborted) continue;
      }
      if (this.stopSignalName) return this.signalExitCode();
      const outcome = await this.runChild(token, termSignal, extraEnv, termLog);
      if (outcome.kind === 'exited') return outcome.code;
      if (outcome.kind === 'stopped') return this.signalExitCode();
      // revoked: the child has been stopped; wait for the next term
    }
  }

  private async runChild(
    token: bigint,
    termSignal: AbortSignal,
    extraEnv: Record<string, string>,
    log: Logger,
  ): Promise<{ kind: 'exited'; code: number } | { kind: 'revoked' } | { kind: 'stopped' }> {
    const [cmd, ...args] = this.config.command as [string, ...string[]];
    // Started first, so that the command is guarded from its first instant (see guardian.ts). It
    // must act well before a standby can be elected (no sooner than about 2/3 of the session
    // timeout after this process dies), so its SIGKILL comes within a quarter of the timeout.
    const negotiatedMs = this.election.currentSession?.negotiatedTimeoutMs ?? this.config.sessionTimeoutMs;
    const guardian = Guardian.start(Math.min(this.config.graceMs, GUARDIAN_KILL_AFTER_MAX_MS, Math.floor(negotiatedMs / 4)), log);
    const child = spawn(cmd, args, {
      stdio: 'inherit',
      detached: true, // own process group, so a shell's children are stopped with it
      env: {
        ...withoutZkAuth(process.env), // the election's credentials are elect's, not the command's
        ...extraEnv,
        FENCING_TOKEN: token.toString(),
        ELECTION_PATH: this.config.path,
        ELECTION_ID: this.config.id,
      },
    });
    if (child.pid !== undefined) guardian?.guard(child.pid); // detached: its pid is its process group id
    const exited = new Promise<{ code: number; how: string }>((resolve) => {
      child.once('error', (err) => {
        log.error({ err }, 'could not start the command');
        resolve({ code: 127, how: 'spawn-error' });
      });
      child.once('exit', (code, signal) => {
        resolve({
          code: code ?? 128 + (signal ? (osConstants.signals[signal] ?? 0) : 0),
          how: signal ? `signal ${signal}` : `code ${code}`,
        });
      });
    });
    void exited.then(() => {
      if (this.runningToken === token) this.runningToken = null;
    });
    if (child.pid !== undefined) this.runningToken = token;
    log.info({ command: this.config.command, childPid: child.pid, guardianPid: guardian?.pid }, 'elected: started the command');
    let onRevoked = (): void => {};
    let onStopped = (): void => {};
    const interrupted = new Promise<'revoked' | 'stopped'>((resolve) => {
      onRevoked = () => resolve('revoked');
      onStopped = () => resolve('stopped');
      if (termSignal.aborted) return onRevoked();
      if (this.stop.signal.aborted) return onStopped();
      termSignal.addEventListener('abort', onRevoked, { once: true });
      this.stop.signal.addEventListener('abort', onStopped, { once: true });
    });
    const first = await Promise.race([exited.then((r) => ({ exit: r })), interrupted.then((why) => ({ why }))]);
    termSignal.removeEventListener('abort', onRevoked);
    this.stop.signal.removeEventListener('abort', onStopped);
    if ('exit' in first) {
      log.info({ exit: first.exit.how }, 'the command exited on its own: leaving the election');
      await guardian?.release();
      return { kind: 'exited', code: first.exit.code };
    }
    log.warn(
      { why: first.why, childPid: child.pid },
      first.why === 'revoked' ? 'leadership lost: stopping the command' : 'stopping the command',
    );
    const r = await terminate(child, exited, this.config.graceMs, log);
    log.info({ exit: r.how }, 'the command stopped');
    await guardian?.release();
    return { kind: first.why };
  }

  private signalExitCode(): number {
    const sig = this.stopSignalName;
    return sig ? 128 + (osConstants.signals[sig] ?? 0) : 1;
  }

  /** Warns when the configured session timeout is below what this cluster and process need. */
  private async checkAdvice(): Promise<void> {
    const windowMs = ADVICE_WINDOW_MS;
    const session = this.election.currentSession;
    if (!session) return;
    try {
      const advice = await measureSessionTimeoutAdvice({ session, windowMs, probeIntervalMs: 100, signal: this.stop.signal });
      const configured = session.negotiatedTimeoutMs;
      if (configured < advice.recommendedSessionTimeoutMs) {
        this.log.warn(
          {
            negotiatedTimeoutMs: configured,
            recommendedSessionTimeoutMs: advice.recommendedSessionTimeoutMs,
            rttMaxMs: advice.rttMs.max,
            stallMaxMs: advice.eventLoopStallMs.max,
          },
          'session timeout below the measured recommendation: expect false failovers (see fencepost doctor)',
        );
      } else {
        this.log.debug(
          { negotiatedTimeoutMs: configured, recommendedSessionTimeoutMs: advice.recommendedSessionTimeoutMs },
          'session timeout check passed',
        );
      }
    } catch (err) {
      this.log.debug({ err }, 'session timeout check skipped');
    }
  }
}

/** A status server that could not listen, in one line naming --status-port (or --status-host). */
function statusPortProblem(err: unknown, host: string, port: number | null, range: PortRange | null): string {
  const at = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  if (err instanceof PortRangeFullError) return `FENCEPOST_PORT_RANGE: no free port in ${err.range[0]}-${err.range[1]} for --status-port 0`;
  if (range !== null && isPortTaken(err))
    return `--status-port: each port picked from FENCEPOST_PORT_RANGE ${range[0]}-${range[1]} was taken before it could be bound`;
  switch ((err as { code?: unknown } | null)?.code) {
    case 'EADDRINUSE':
      return `--status-port: ${at} is already in use (another fencepost elect on this host? pick another --status-port)`;
    case 'EACCES':
      return `--status-port: not allowed to listen on ${at} (ports below 1024 need privileges)`;
    case 'EADDRNOTAVAIL':
      return `--status-host: ${host} is not an address of this machine`;
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `--status-host: cannot resolve ${host}`;
    default:
      return `--status-port: cannot listen on ${at}: ${firstLine(err)}`;
  }
}

function withoutZkAuth(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const rest = { ...env };
  delete rest.ZK_AUTH;
  return rest;
}

/** SIGTERM to the child's process group, SIGKILL after `graceMs`; resolves when it has exited. */
async function terminate<T>(child: ChildProcess, exited: Promise<T>, graceMs: number, log: Logger): Promise<T> {
  const signalGroup = (sig: NodeJS.Signals): void => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, sig);
    } catch {
      try {
        child.kill(sig);
      } catch {
        // already gone
      }
    }
  };
  signalGroup('SIGTERM');
  const timer = setTimeout(() => {
    log.warn({ childPid: child.pid, graceMs }, 'grace period over: SIGKILL');
    signalGroup('SIGKILL');
  }, graceMs);
  try {
    return await exited;
  } finally {
    clearTimeout(timer);
  }
}
