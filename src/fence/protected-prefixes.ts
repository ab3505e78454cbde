// The proxy's copy of the protected object-key prefixes (protect.ts; fencepost.protected_prefixes),
// so the HTTP door can resolve a write's fence key without a query per request. It is only the
// friendly path: the database's trigger (refuse_misfenced_object) refuses a misfenced object
// whatever this copy says. A write the trigger refused (FP403) means the copy is stale: the door
// calls refresh() and answers from the new copy.
import type pg from 'pg';
import type { Logger } from 'pino';
import { protectedPrefixes, protectingPrefix } from './protect.ts';

export interface ProtectedPrefix {
  prefix: string;
  fenceKey: string;
}

export class ProtectedPrefixes {
  private readonly pool: pg.Pool;
  /** Longest prefix first (protectedPrefixes' order). */
  private list: readonly ProtectedPrefix[] = [];
  private running: Promise<void> | null = null;
  private queued: Promise<void> | null = null;

  constructor(pool: pg.Pool) {
    this.pool = pool;
  }

  /** The prefixes as last read, longest first. */
  current(): readonly ProtectedPrefix[] {
    return this.list;
  }

  /** The longest protected prefix `objectKey` starts with, and its fence key; null when none (as last read). */
  protecting(objectKey: string): ProtectedPrefix | null {
    return protectingPrefix(this.list, objectKey);
  }

  /**
   * Reads the list again. Resolves once a read that started after this call has finished, so a
   * caller that saw the database refuse a write sees every declaration committed before: a read
   * already in flight may have started before the declaration, so one more is queued behind it
   * (at most one, shared by every caller meanwhile). Rejects when the read fails (the old copy stays).
   */
  refresh(): Promise<void> {
    if (this.queued) return this.queued;
    if (this.running) {
      const queued = this.running
        .catch(() => {})
        .then(() => {
          this.queued = null;
          return this.read();
        });
      this.queued = queued;
      return queued;
    }
    return this.read();
  }

  private read(): Promise<void> {
    const running = (async () => {
      try {
        this.list = Object.freeze(await protectedPrefixes(this.pool));
      } finally {
        this.running = null;
      }
    })();
    this.running = running;
    return running;
  }

  /** Refreshes every `intervalMs` until the returned function is called; a failed read is logged (warn) and the old copy kept. */
  refreshing(intervalMs: number, logger?: Logger): () => void {
    const timer = setInterval(() => {
      this.refresh().catch((err: unknown) =>
        logger?.warn({ err }, 'reading the protected prefixes failed; the previous list stays (Postgres still enforces them)'),
      );
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }
}
