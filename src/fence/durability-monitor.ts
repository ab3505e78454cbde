// The fence's durability, checked all the time: checkDurability (durability.ts) on a timer, its
// latest report kept for GET /readyz and /metrics (a probe or a scrape runs no query), one log line
// per change (a warning when a reason appears, an info line when it clears; not one per check),
// and, when a synchronous standby is required, the verdict every door asks before a write.
import type pg from 'pg';
import type { Logger } from 'pino';
import { checkDurability, unknownDurability, type DurabilityReason, type DurabilityReport } from './durability.ts';

export interface DurabilityMonitorOptions {
  /** Time between the end of one check and the start of the next; 0: no timer (each report() checks afresh). */
  intervalMs: number;
  /** Writes are refused while any reason holds, or the check fails (FENCEPOST_REQUIRE_SYNC_STANDBY). */
  requireSyncStandby: boolean;
  /** Null: the changes are not logged. */
  logger: Logger | null;
}

export class DurabilityMonitor {
  private latestReport: DurabilityReport | null = null;
  private running: Promise<DurabilityReport> | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  /** The reasons logged last: a reason is logged when it appears and when it clears. */
  private logged = new Set<DurabilityReason>();
  private readonly listeners = new Set<() => void>();

  constructor(
    private readonly pool: pg.Pool,
    readonly opts: Readonly<DurabilityMonitorOptions>,
  ) {}

  /** Checks now, then every intervalMs until stop(). Resolves with the first report. */
  async start(): Promise<DurabilityReport> {
    this.stopped = false;
    const first = await this.check();
    this.schedule();
    return first;
  }

  /** Stops the timer; resolves once a check under way has ended (its connection closed). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.running?.catch(() => {});
  }

  /** The latest report; with no timer running, a fresh check. */
  async report(): Promise<DurabilityReport> {
    if (this.timer !== null && this.latestReport !== null) return this.latestReport;
    return await this.check();
  }

  /** The latest report without waiting; null before the first check ends. */
  latest(): DurabilityReport | null {
    return this.latestReport;
  }

  /**
   * Why writes are refused now, or null when they are not: with requireSyncStandby, the latest
   * report's reasons (before the first check ends: refused, as not known to be safe).
   */
  refusal(): { reasons: DurabilityReason[]; warnings: string[] } | null {
    if (!this.opts.requireSyncStandby) return null;
    const r = this.latestReport;
    if (r === null) return { reasons: ['check_failed'], warnings: ['the durability check has not finished yet'] };
    return r.reasons.length > 0 ? { reasons: r.reasons, warnings: r.warnings } : null;
  }

  /** Called after each check whose refusal() may differ from the one before; returns the unsubscribe. */
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** One check (a caller that comes while one runs shares it). */
  check(): Promise<DurabilityReport> {
    this.running ??= this.runCheck().finally(() => (this.running = null));
    return this.running;
  }

  private async runCheck(): Promise<DurabilityReport> {
    let failure: unknown = null;
    const report = await checkDurability(this.pool, { requireSyncStandby: this.opts.requireSyncStandby }).catch((err: unknown) => {
      failure = err;
      return unknownDurability();
    });
    const before = this.latestReport?.reasons.join() ?? null;
    this.latestReport = report;
    this.logChanges(report, failure);
    if (before !== report.reasons.join()) for (const listener of this.listeners) listener();
    return report;
  }

  private logChanges(report: DurabilityReport, failure: unknown): void {
    const log = this.opts.logger;
    const now = new Set(report.reasons);
    if (log) {
      report.reasons.forEach((reason, i) => {
        if (this.logged.has(reason)) return;
        const refusing = this.opts.requireSyncStandby ? { refusingWrites: true } : {};
        log.warn(
          { component: 'durability', reason, ...refusing, ...(failure !== null && reason === 'check_failed' ? { err: failure } : {}) },
          report.warnings[i]!,
        );
      });
      for (const reason of this.logged) {
        if (!now.has(reason)) log.info({ component: 'durability', reason }, `durability: ${reason} no longer holds`);
      }
      if (this.logged.size > 0 && now.size === 0) {
        log.info(
          { component: 'durability' },
          `durability: no failover warnings left${this.opts.requireSyncStandby ? '; writes accepted again' : ''}`,
        );
      }
    }
    this.logged = now;
  }

  private schedule(): void {
    if (this.stopped || this.opts.intervalMs <= 0) return;
    this.timer = setTimeout(() => {
      void this.check().finally(() => this.schedule());
    }, this.opts.intervalMs);
    this.timer.unref();
  }
}
