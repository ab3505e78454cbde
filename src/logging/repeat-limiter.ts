// Repeated errors in the log, bounded: during a Postgres outage every request fails the same way,
// and a line with a full stack each is megabytes a second that say one thing. Per kind of error
// (the caller's key: a code, not a message with ids in it) the first in a window is logged at
// once, without its stack (type, message, code; the stack at debug), and the rest are counted
// into one line when the window ends: "… and 7,559 more like it in the last 5 s".
import type { Logger } from 'pino';

export interface RepeatLimiterOptions {
  /** How long repeats of a logged error are counted before one line says how many. */
  windowMs: number;
  /** Most kinds counted apart at once; past it, the rest share one kind. */
  maxKinds: number;
}

type Level = 'error' | 'warn';

interface Window {
  timer: NodeJS.Timeout;
  repeats: number;
  level: Level;
  msg: string;
  fields: Record<string, unknown>;
}

/** An error as a log field, without its stack. */
export function errorSummary(err: unknown): Record<string, unknown> {
  if (!(err instanceof Error)) return { message: String(err) };
  const code = (err as { code?: unknown }).code;
  return { type: err.name, message: err.message, ...(typeof code === 'string' ? { code } : {}) };
}

export class RepeatLimiter {
  private readonly windows = new Map<string, Window>();

  constructor(
    private readonly logger: Logger | null,
    private readonly opts: RepeatLimiterOptions,
  ) {}

  /**
   * Logs `msg` for `kind` (first in its window), or counts it. `err` goes without its stack, except
   * at debug. `fields` are repeated on the count's line; `first` (a request id, say) only on this one.
   */
  log(level: Level, kind: string, fields: Record<string, unknown>, err: unknown, msg: string, first: Record<string, unknown> = {}): void {
    if (this.logger === null) return;
    const key = this.windows.has(kind) || this.windows.size < this.opts.maxKinds ? kind : '(other)';
    const open = this.windows.get(key);
    if (open !== undefined) {
      open.repeats++;
      return;
    }
    this.logger[level]({ ...first, ...fields, error: errorSummary(err) }, msg);
    if (this.logger.isLevelEnabled('debug')) this.logger.debug({ ...first, ...fields, err }, `${msg} (stack)`);
    const timer = setTimeout(() => this.close(key), this.opts.windowMs);
    timer.unref();
    this.windows.set(key, { timer, repeats: 0, level, msg, fields });
  }

  /** Ends every window now, logging their counts (shutdown). */
  flush(): void {
    for (const key of [...this.windows.keys()]) this.close(key);
  }

  private close(key: string): void {
    const w = this.windows.get(key);
    if (w === undefined) return;
    clearTimeout(w.timer);
    this.windows.delete(key);
    if (w.repeats === 0 || this.logger === null) return;
    this.logger[w.level](
      { ...w.fields, repeats: w.repeats, windowMs: this.opts.windowMs },
      `${w.msg} … and ${w.repeats.toLocaleString('en')} more like it in the last ${this.opts.windowMs / 1000} s`,
    );
  }
}
