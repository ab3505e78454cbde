// Prometheus metrics of one `fencepost elect` (GET /metrics on --status-port, status-server.ts), on
// a registry of its own (tests run several in one process; prom-client's global registry would mix
// them up), with the process metrics merged in at scrape time (metrics/process.ts).
//
// Every series carries election_path and candidate (--id). Both are bounded by the deployment:
// one path per election, one candidate per replica. The default --id is <hostname>-<pid>, a new
// one at every restart, so give each replica a stable --id (its pod or host name) to keep the
// number of series from growing with restarts.
//
// "Leader" here is the ZooKeeper term: is_leader is 1 from `elected` to `revoked`, including while
// the fence advance (--proxy) runs and before the command has started; /leader (readiness) answers
// the narrower question of whether the command runs.
import { Counter, Gauge, Registry } from 'prom-client';
import type { Election, SessionState } from '../election/index.ts';
import { processMetrics } from '../metrics/process.ts';

/** Every value of fencepost_election_session_state's `state` label (ZkSession's states, as /healthz names them). */
export const SESSION_STATES = ['connecting', 'connected', 'suspended', 'lost', 'closed'] as const satisfies readonly SessionState[];

const LABELS = ['election_path', 'candidate'] as const;

export class ElectionMetrics {
  readonly registry = new Registry();
  readonly contentType = Registry.PROMETHEUS_CONTENT_TYPE;
  private readonly labels: { election_path: string; candidate: string };
  private readonly includeProcess: boolean;
  /** When this candidate's leadership last changed (elected or revoked), or when it started. */
  private changedAt: number;
  private readonly now: () => number;
  private readonly changes: Counter<(typeof LABELS)[number]>;
  private readonly advanceFailures: Counter<(typeof LABELS)[number]> | null;

  constructor(election: Election, opts: { fenceAdvance?: boolean; processMetrics?: boolean; now?: () => number } = {}) {
    this.labels = { election_path: election.path, candidate: election.id };
    this.includeProcess = opts.processMetrics ?? true;
    this.now = opts.now ?? Date.now;
    this.changedAt = this.now();
    const labels = this.labels;
    const registers = [this.registry];
    new Gauge({
      name: 'fencepost_election_is_leader',
      help: '1 while this candidate holds a term of the election (from elected to revoked, the fence advance included), else 0. sum by (election_path) is the number of leaders: 1, or 0 during a handover.',
      labelNames: LABELS,
      registers,
      collect() {
        this.set(labels, election.isLeader ? 1 : 0);
      },
    });
    new Gauge({
      name: 'fencepost_election_token',
      help: 'Fencing token of the current term, exposed only while this candidate leads.',
      labelNames: LABELS,
      registers,
      collect() {
        this.reset();
        const token = election.token;
        // ZooKeeper sequence numbers: 32-bit, exact as a float64.
        if (token !== null) this.set(labels, Number(token));
      },
    });
    this.changes = new Counter({
      name: 'fencepost_election_leadership_changes_total',
      help: 'Terms this candidate has won (each one a change of leader). sum by (election_path) of its increase is how often leadership moved.',
      labelNames: LABELS,
      registers,
    });
    this.changes.inc(labels, 0); // a series that first appears at 1 is invisible to increase()
    const since = () => (this.now() - this.changedAt) / 1000;
    new Gauge({
      name: 'fencepost_election_seconds_since_change',
      help: 'Seconds since this candidate was last elected or lost its term (since it started, if neither yet). On the leader: how long it has led.',
      labelNames: LABELS,
      registers,
      collect() {
        this.set(labels, since());
      },
    });
    new Gauge({
      name: 'fencepost_election_session_state',
      help: 'ZooKeeper session state of this candidate: 1 for the current state, 0 for the others. suspended: disconnected, the session may still live; lost: expired (or closed by the server); connecting: no session yet.',
      labelNames: [...LABELS, 'state'] as const,
      registers,
      collect() {
        const current: SessionState = election.currentSession?.state ?? 'connecting';
        for (const state of SESSION_STATES) this.set({ ...labels, state }, state === current ? 1 : 0);
      },
    });
    this.advanceFailures = opts.fenceAdvance
      ? new Counter({
          name: 'fencepost_election_fence_advance_failures_total',
          help: 'Fence advances at the proxy (--proxy) that failed (proxy unreachable, 5xx or no answer in time) and were retried or given up on, while this candidate led.',
          labelNames: LABELS,
          registers,
        })
      : null;
    this.advanceFailures?.inc(labels, 0);
    election.on('elected', () => {
      this.changedAt = this.now();
      this.changes.inc(labels);
    });
    election.on('revoked', () => {
      this.changedAt = this.now();
    });
  }

  /** One failed fence advance (only counted when constructed with fenceAdvance). */
  fenceAdvanceFailed(): void {
    this.advanceFailures?.inc(this.labels);
  }

  /** The exposition text: this election's metrics, then the process's. */
  async text(): Promise<string> {
    const registries = this.includeProcess ? [this.registry, processMetrics()] : [this.registry];
    return await Registry.merge(registries).metrics();
  }
}
