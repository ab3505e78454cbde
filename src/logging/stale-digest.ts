// Stale-token rejections in the log, at a rate an operator can keep: a zombie writing in a loop is
// thousands of refusals a second, and a warn line each (~190 bytes) is gigabytes an hour. So per
// interval: the first rejection is logged at once, in full (the sample: fence key, tokens, door,
// writer), and the rest are counted per fence key and door and logged as one line when the
// interval ends. A steady stream is two lines per interval whatever its rate. Every rejection is
// still counted in /metrics and recorded in the rejection log; this is only the log.
import type { Logger } from 'pino';

export interface StaleRejection {
  door: string;
  fenceKey: string;
  token: bigint;
  highestToken: bigint | null;
  writerId?: string | null;
}

export interface StaleDigestOptions {
  /** How long the rejections after a logged sample are gathered into one line. */
  intervalMs: number;
  /** Most fence keys named in one summary line; the rest are counted together. */
  maxFenceKeys: number;
}

export class StaleDigest {
  private timer: NodeJS.Timeout | null = null;
  private total = 0;
  private readonly byFenceKey = new Map<string, number>();
  private otherFenceKeys = 0;
  private readonly byDoor = new Map<string, number>();
  private last: StaleRejection | null = null;

  constructor(
    private readonly logger: Logger | null,
    private readonly opts: StaleDigestOptions,
  ) {}

  /** `sampleLogger`: where the sample goes if this is one (a request's child logger, with its id). */
  note(r: StaleRejection, sampleLogger?: Pick<Logger, 'warn'>): void {
    if (this.logger === null) return;
    if (this.timer === null) {
      // The first of an interval: in full, now.
      (sampleLogger ?? this.logger).warn({ ...describe(r), summedForMs: this.opts.intervalMs }, 'stale token rejected');
      this.timer = setTimeout(() => this.flush(), this.opts.intervalMs);
      this.timer.unref();
      return;
    }
    this.total++;
    this.last = r;
    this.byDoor.set(r.door, (this.byDoor.get(r.door) ?? 0) + 1);
    const n = this.byFenceKey.get(r.fenceKey);
    if (n !== undefined) this.byFenceKey.set(r.fenceKey, n + 1);
    else if (this.byFenceKey.size < this.opts.maxFenceKeys) this.byFenceKey.set(r.fenceKey, 1);
    else this.otherFenceKeys++;
  }

  /** Logs what the interval gathered (nothing if only its sample came) and starts the next interval. */
  flush(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.total === 0 || this.logger === null) return;
    const byFenceKey = Object.fromEntries([...this.byFenceKey].sort((a, b) => b[1] - a[1]));
    this.logger.warn(
      {
        rejections: this.total,
        intervalMs: this.opts.intervalMs,
        byFenceKey,
        ...(this.otherFenceKeys > 0 ? { otherFenceKeys: this.otherFenceKeys } : {}),
        byDoor: Object.fromEntries(this.byDoor),
        last: this.last ? describe(this.last) : null,
      },
      `stale tokens rejected: ${this.total.toLocaleString('en')} more in the last ${this.opts.intervalMs / 1000} s`,
    );
    this.total = 0;
    this.otherFenceKeys = 0;
    this.byFenceKey.clear();
    this.byDoor.clear();
    this.last = null;
  }
}

function describe(r: StaleRejection): Record<string, unknown> {
  return {
    door: r.door,
    fenceKey: r.fenceKey,
    token: r.token.toString(),
    highestToken: r.highestToken?.toString() ?? null,
    ...(r.writerId != null ? { writerId: r.writerId } : {}),
  };
}
