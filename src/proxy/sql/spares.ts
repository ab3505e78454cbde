// Spare backends: after a writer connects, the endpoint logs in one more backend with the very same
// startup (client login, parameters, settings) and readies it for its fence (Fence.warmSession), so
// the next connect like it waits only for its fence on a warm backend, not for a new backend's
// login and first statements (most of a fenced connect's cost: bench/log/2026-12-08).
//
// A spare is nobody's session: it is registered nowhere, fenced at nothing, and a raise does not
// concern it; the writer who takes it is fenced on it as on a new backend (session-fence.ts). It
// never serves two writers: taken once, it is the writer's. At most `max` spares at once, each kept
// `keepMs`; one that hears anything while waiting (a FATAL before it goes) or closes is dropped.
// DATABASE_URL with several hosts keeps none (a spare could outlive a failover on the old primary).
import type { Logger } from 'pino';
import { fenceQuestions, type Backend } from './backend.ts';
import type { Fence } from '../../fence/index.ts';

export interface SpareOptions {
  /** Spares kept at once (0: none). */
  max: number;
  /** How long an untaken spare is kept. */
  keepMs: number;
  /** Each warm-up statement must be answered within this. */
  timeoutMs: number;
  fence: Pick<Fence, 'warmSession'>;
  logger: Logger;
}

interface Spare {
  backend: Backend;
  timer: NodeJS.Timeout;
  unwatch: () => void;
}

export class SpareBackends {
  /** Untaken spares by startup, oldest first. */
  private readonly spares = new Map<string, Spare[]>();
  private count = 0;
  private opening = 0;
  private closed = false;

  constructor(private readonly opts: SpareOptions) {}

  /** A spare made for `startup`, now the caller's; null when there is none. */
  take(startup: string): Backend | null {
    for (;;) {
      const spare = this.spares.get(startup)?.[0];
      if (!spare) return null;
      this.drop(startup, spare, false);
      const b = spare.backend;
      if (!b.socket.destroyed && !b.socket.readableEnded) return b;
      b.socket.destroy();
    }
  }

  /**
   * After a connect with `startup`: makes a spare for a connect like it, unless `max` are kept or
   * being made. `open` logs a backend in as that connect's did; `capability` is the one its fence
   * will present. One connect, one spare: a burst of N connects like each other readies N (up to
   * `max`) for the next burst.
   */
  replenish(startup: string, capability: string, open: () => Promise<Backend>): void {
    if (this.closed || this.count + this.opening >= this.opts.max) return;
    this.opening++;
    void this.make(startup, capability, open).finally(() => this.opening--);
  }

  /** Ends every spare; none is made after. */
  close(): void {
    this.closed = true;
    for (const [startup, list] of this.spares) for (const spare of [...list]) this.drop(startup, spare, true);
  }

  /** Spares kept and being made. */
  get size(): number {
    return this.count + this.opening;
  }

  private async make(startup: string, capability: string, open: () => Promise<Backend>): Promise<void> {
    let backend: Backend;
    try {
      backend = await open();
    } catch (err) {
      this.opts.logger.debug({ err }, 'SQL endpoint: no spare backend (its login failed)');
      return;
    }
    const warm = await this.opts.fence.warmSession(capability, fenceQuestions(backend, this.opts.timeoutMs)).catch(() => false);
    if (!warm || this.closed || backend.socket.destroyed) {
      backend.socket.destroy();
      return;
    }
    // Waiting, a backend says nothing: whatever it sends (a FATAL before it goes) makes it unusable.
    const spare: Spare = { backend, timer: setTimeout(() => lost(), this.opts.keepMs), unwatch: () => {} };
    const lost = () => this.drop(startup, spare, true);
    spare.timer.unref();
    backend.socket.on('data', lost);
    backend.socket.on('close', lost);
    backend.socket.on('error', lost);
    spare.unwatch = () => {
      backend.socket.off('data', lost);
      backend.socket.off('close', lost);
      backend.socket.off('error', lost);
    };
    this.spares.set(startup, [...(this.spares.get(startup) ?? []), spare]);
    this.count++;
  }

  private drop(startup: string, spare: Spare, end: boolean): void {
    const list = this.spares.get(startup) ?? [];
    if (!list.includes(spare)) return;
    clearTimeout(spare.timer);
    spare.unwatch();
    const left = list.filter((s) => s !== spare);
    if (left.length > 0) this.spares.set(startup, left);
    else this.spares.delete(startup);
    this.count--;
    if (end) spare.backend.socket.destroy();
  }
}

/** The identity of a backend's startup: a spare serves only a connect whose startup is the same. */
export function startupIdentity(login: string, parameters: ReadonlyMap<string, string>, settings: ReadonlyMap<string, string>): string {
  const sorted = (m: ReadonlyMap<string, string>) => [...m].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return JSON.stringify([login, sorted(parameters), sorted(settings)]);
}
