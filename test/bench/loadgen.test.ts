// The bench's coordinated-omission correction (bench/loadgen.ts), the one wrk applies to its own
// percentiles: pgbench's latencies get it too, so a p99 through the proxy (wrk) and a direct p99
// (pgbench) weigh a stall alike. And how pgbench's per-transaction log is read (parsePgbenchLogs).
import { describe, expect, it } from 'vitest';
import { correctCoordinatedOmission, parsePgbenchLogs } from '../../bench/loadgen.ts';
import { distribution } from '../../src/election/advice.ts';

describe('correctCoordinatedOmission', () => {
  it('adds nothing when no latency reaches twice the expected interval', () => {
    const l = [1, 1.5, 1.99, 0.2];
    expect(correctCoordinatedOmission(l, 1)).toEqual(l);
  });

  it('adds the samples wrk adds: L − e, L − 2e, … while above e', () => {
    const out = correctCoordinatedOmission([10, 1], 1);
    expect(out.slice(2)).toEqual([9, 8, 7, 6, 5, 4, 3, 2]);
    // Exactly 2e adds none above e (2e − e = e is not above e).
    expect(correctCoordinatedOmission([2], 1)).toEqual([2]);
    expect(correctCoordinatedOmission([2.5], 1)).toEqual([2.5, 1.5]);
  });

  it('lets one stall of every connection show at p99, as it does in wrk', () => {
    // 32 connections, 10 s, 1 ms per request: 320,000 requests, of which one round of 32 stalled 300 ms.
    const connections = 32;
    const latencies = [...Array.from({ length: 320_000 - connections }, () => 1), ...Array.from({ length: connections }, () => 300)];
    const expected = (10_000 * connections) / latencies.length;
    expect(distribution(latencies).p99).toBe(1);
    const corrected = distribution(correctCoordinatedOmission(latencies, expected));
    expect(corrected.p99).toBeGreaterThan(100);
    expect(corrected.p99).toBeLessThan(300);
    expect(corrected.median).toBe(1);
  });

  it('leaves latencies alone without an expected interval', () => {
    expect(correctCoordinatedOmission([5, 500], 0)).toEqual([5, 500]);
  });
});

describe('parsePgbenchLogs', () => {
  it("reads each transaction's latency; a scheduled run's (-R) counts from its schedule, its lag added", () => {
    const free = '0 1 1500 0 1733390000 123456\n0 2 2500 0 1733390000 223456\n';
    const scheduled = '1 1 1500 0 1733390000 123456 300\n1 2 failed 0 1733390000 223456 0\n';
    expect(parsePgbenchLogs([free, scheduled])).toEqual({ latenciesMs: [1.5, 2.5, 1.8], failed: 1 });
  });
});
