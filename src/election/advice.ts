// Session-timeout advice, measured on the user's own cluster (the lesson's worked example 3).
//
// How the timeout T is used here: the client probes the server every T/6 (checked every T/12) and
// declares the connection dead after 2/3·T without a reply. A healthy connection's last reply is at
// most T/4 + RTT + stall old, so a false suspension needs RTT + stall > 5/12·T, i.e. T < 2.4·(RTT + stall).
// We recommend T ≥ 5·(worst RTT + worst event-loop stall seen): about twice that bound, because a short
// measurement window under-samples tails (GC pauses, noisy neighbours). Floors: 2000 ms and the server's
// minimum (2 × tickTime by default). A crash then costs about T + one tick + a few RTTs of failover.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { ZkSession, ZK_CONNECT_WAIT_MS } from './zk-session.ts';

export const ADVICE_HEADROOM = 5;
export const ADVICE_FLOOR_MS = 2000;

export interface Distribution {
  samples: number;
  median: number;
  p99: number;
  max: number;
}

export interface SessionTimeoutAdvice {
  windowMs: number;
  /** Round trips of a trivial request (exists /), in ms. */
  rttMs: Distribution;
  /** How late a 10 ms timer fired on this process's event loop, in ms. */
  eventLoopStallMs: Distribution;
  /** Session timeouts the server grants (requesting 1 ms and 10^9 ms), if measured. */
  serverBoundsMs: { min: number; max: number } | null;
  recommendedSessionTimeoutMs: number;
  /** Failover the recommendation implies: crash ≈ T + tick + RTTs; graceful ≈ a few RTTs. */
  impliedFailoverMs: { crash: number; graceful: number };
  /** Time to notice a dead connection with the recommended T (2/3·T). */
  deadConnectionDetectionMs: number;
}

export interface MeasureOptions {
  /** Connect string; a session is opened for the measurement (and two short ones for the server bounds). */
  connect?: string;
  /** Or an existing session to measure through (server bounds are then not measured). */
  session?: ZkSession;
  windowMs?: number;
  probeIntervalMs?: number;
  signal?: AbortSignal;
  /** Told each step as it begins (connected, server bounds, each second of the window), for a progress display. */
  onProgress?: (step: string) => void;
}

export function distribution(values: readonly number[]): Distribution {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? 0;
  return { samples: sorted.length, median: round(at(0.5)), p99: round(at(0.99)), max: round(sorted[sorted.length - 1] ?? 0) };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

export function recommendSessionTimeout(input: {
  rttMaxMs: number;
  stallMaxMs: number;
  serverBoundsMs?: { min: number; max: number } | null;
}): number {
  const raw = ADVICE_HEADROOM * (input.rttMaxMs + input.stallMaxMs);
  let t = Math.max(ADVICE_FLOOR_MS, input.serverBoundsMs?.min ?? 0, Math.ceil(raw / 500) * 500);
  if (input.serverBoundsMs) t = Math.min(t, input.serverBoundsMs.max);
  return t;
}

/** Measures RTT and event-loop stalls for `windowMs` and recommends a session timeout. */
export async function measureSessionTimeoutAdvice(opts: MeasureOptions): Promise<SessionTimeoutAdvice> {
  const windowMs = opts.windowMs ?? 5000;
  const probeIntervalMs = opts.probeIntervalMs ?? 50;
  if (!opts.session && !opts.connect) throw new Error('measureSessionTimeoutAdvice needs connect or session');
  const progress = opts.onProgress ?? (() => {});
  if (!opts.session) progress(`connecting to ZooKeeper at ${opts.connect}`);
  const own = opts.session
    ? null
    : await ZkSession.open({ connect: opts.connect!, sessionTimeoutMs: 10_000, connectTimeoutMs: ZK_CONNECT_WAIT_MS });
  const session = opts.session ?? own!;
  try {
    if (own) progress('connected; asking the server for its session timeout bounds');
    const serverBoundsMs = opts.connect && !opts.session ? await measureServerBounds(opts.connect) : null;
    progress(`measuring round trips and event-loop stalls for ${windowMs} ms`);
    const started = performance.now();
    let reported = 0;
    const stalls: number[] = [];
    const tickMs = 10;
    let expected = performance.now() + tickMs;
    const timer = setInterval(() => {
      const t = performance.now();
      stalls.push(Math.max(0, t - expected));
      expected = t + tickMs;
    }, tickMs);
    const rtts: number[] = [];
    const end = performance.now() + windowMs;
    try {
      while (performance.now() < end && !opts.signal?.aborted) {
        try {
          rtts.push(await session.ping());
        } catch {
          // a failed probe counts as a round trip as long as its deadline (shows up as a large max)
          rtts.push(session.requestTimeoutMs);
        }
        await sleep(probeIntervalMs);
        const seconds = Math.floor((performance.now() - started) / 1000);
        if (seconds > reported && performance.now() < end) progress(`${(reported = seconds)} s of ${Math.ceil(windowMs / 1000)} s`);
      }
    } finally {
      clearInterval(timer);
    }
    const rttMs = distribution(rtts);
    const eventLoopStallMs = distribution(stalls);
    const recommended = recommendSessionTimeout({ rttMaxMs: rttMs.max, stallMaxMs: eventLoopStallMs.max, serverBoundsMs });
    const tick = serverBoundsMs ? serverBoundsMs.min / 2 : 0;
    return {
      windowMs,
      rttMs,
      eventLoopStallMs,
      serverBoundsMs,
      recommendedSessionTimeoutMs: recommended,
      impliedFailoverMs: {
        crash: Math.round(recommended + tick + 3 * rttMs.p99),
        graceful: Math.round(3 * rttMs.p99 + eventLoopStallMs.p99),
      },
      deadConnectionDetectionMs: Math.round((recommended * 2) / 3),
    };
  } finally {
    await own?.close();
  }
}

/** The server's granted range: ZooKeeper clamps requests to [minSessionTimeout, maxSessionTimeout]. */
async function measureServerBounds(connect: string): Promise<{ min: number; max: number }> {
  const grant = async (requested: number): Promise<number> => {
    const s = await ZkSession.open({ connect, sessionTimeoutMs: requested, connectTimeoutMs: 5000 });
    const t = s.negotiatedTimeoutMs;
    await s.close();
    return t;
  };
  return { min: await grant(1), max: await grant(1_000_000_000) };
}

/** Human-readable summary for `fencepost doctor` / `fencepost elect --advise`. */
export function formatAdvice(a: SessionTimeoutAdvice, configuredMs?: number): string {
  const lines = [
    `ZooKeeper round trip over ${a.rttMs.samples} probes: median ${a.rttMs.median} ms, p99 ${a.rttMs.p99} ms, max ${a.rttMs.max} ms`,
    `event-loop stall over ${a.windowMs} ms: median ${a.eventLoopStallMs.median} ms, p99 ${a.eventLoopStallMs.p99} ms, max ${a.eventLoopStallMs.max} ms`,
  ];
  if (a.serverBoundsMs) lines.push(`server grants session timeouts from ${a.serverBoundsMs.min} ms to ${a.serverBoundsMs.max} ms`);
  lines.push(
    `recommended session timeout: ${a.recommendedSessionTimeoutMs} ms (≥ ${ADVICE_HEADROOM} × (max RTT + max stall), floor ${ADVICE_FLOOR_MS} ms)`,
    `  → a dead connection is noticed within ~${a.deadConnectionDetectionMs} ms; a crashed leader is replaced after ~${a.impliedFailoverMs.crash} ms; a graceful handover takes ~${a.impliedFailoverMs.graceful} ms`,
    `  shorter: faster failover, but a stall or RTT spike over ~${Math.round(a.recommendedSessionTimeoutMs / ADVICE_HEADROOM)} ms risks a false failover; longer: steadier, slower crash failover`,
  );
  if (configuredMs !== undefined) {
    lines.push(
      configuredMs < a.recommendedSessionTimeoutMs
        ? `WARNING: the configured ${configuredMs} ms is below the recommendation: expect false failovers under stalls`
        : `the configured ${configuredMs} ms is at or above the recommendation`,
    );
  }
  return lines.join('\n');
}
