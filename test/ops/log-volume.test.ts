// Logs an operator can keep: N stale rejections make O(1) lines per interval (the first in full, then
// one line with the counts per fence key), and M requests failing the same way during a Postgres
// outage make a bounded number of lines, with counts and without stacks (stacks at debug only).
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { pino } from 'pino';
import type { FastifyInstance } from 'fastify';
import { buildApp } from '../../src/proxy/http/app.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../support/db.ts';
import { closedPort } from '../../tools/ports.ts';

type Line = Record<string, unknown>;

function capture(level: string): { logger: pino.Logger; lines: Line[] } {
  const lines: Line[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n')) if (l !== '') lines.push(JSON.parse(l) as Line);
      done();
    },
  });
  return { logger: pino({ level }, sink), lines };
}

function app(pool: pg.Pool, logger: pino.Logger, logDigest: { staleIntervalMs?: number; repeatWindowMs?: number }): FastifyInstance {
  return buildApp({
    store: new FenceStore(pool, { ...STORE_DEFAULTS, logger }),
    bodyLimitBytes: 1024,
    logger,
    logDigest,
    transactions: { clientRole: clientRoleFor(pool) },
  });
}

const put = (a: FastifyInstance, key: string, token: number, fenceKey: string) =>
  a.inject({ method: 'PUT', url: `/v1/objects/${key}`, headers: { 'fencing-token': String(token), 'fence-key': fenceKey }, payload: 'x' });

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

describe('stale rejections', () => {
  test('N stale rejections in one interval make two lines: the first in full, then the counts per fence key', async () => {
    const { logger, lines } = capture('info');
    const a = app(db.pool, logger, { staleIntervalMs: 60_000 });
    try {
      expect((await put(a, 'lv/a', 10, 'lv-a')).statusCode).toBe(200);
      expect((await put(a, 'lv/b', 10, 'lv-b')).statusCode).toBe(200);
      const N = 150;
      for (let i = 0; i < N; i++)
        expect((await put(a, i % 3 === 0 ? 'lv/b' : 'lv/a', 5, i % 3 === 0 ? 'lv-b' : 'lv-a')).statusCode).toBe(409);
      await a.close(); // ends the interval
      const stale = lines.filter((l) => typeof l.msg === 'string' && l.msg.startsWith('stale token'));
      expect(stale).toHaveLength(2);
      expect(stale[0]).toMatchObject({ msg: 'stale token rejected', door: 'http', fenceKey: 'lv-b', token: '5', highestToken: '10' });
      expect(stale[0]!.reqId).toBeDefined();
      expect(stale[1]).toMatchObject({ rejections: N - 1, byFenceKey: { 'lv-a': 100, 'lv-b': 49 }, byDoor: { http: N - 1 } });
      expect(stale[1]!.msg).toBe(`stale tokens rejected: ${N - 1} more in the last 60 s`);
    } finally {
      await a.close();
    }
  });

  test('a steady stream makes at most two lines per interval, whatever its rate', async () => {
    const { logger, lines } = capture('info');
    const a = app(db.pool, logger, { staleIntervalMs: 300 });
    try {
      expect((await put(a, 'lv/c', 10, 'lv-c')).statusCode).toBe(200);
      const started = Date.now();
      let n = 0;
      while (Date.now() - started < 1500) {
        await Promise.all(Array.from({ length: 10 }, () => put(a, 'lv/c', 1, 'lv-c')));
        n += 10;
      }
      const elapsed = Date.now() - started;
      await sleep(350);
      await a.close();
      const stale = lines.filter((l) => typeof l.msg === 'string' && l.msg.startsWith('stale token'));
      const intervals = Math.ceil(elapsed / 300) + 1;
      expect(n).toBeGreaterThan(4 * intervals);
      expect(stale.length).toBeLessThanOrEqual(2 * intervals);
      // Every rejection is in a line: one per sample, the rest in the counts.
      const counted = stale.reduce((sum, l) => sum + (l.msg === 'stale token rejected' ? 1 : (l.rejections as number)), 0);
      expect(counted).toBe(n);
    } finally {
      await a.close();
    }
  });
});

describe('a Postgres outage', () => {
  test('M failed requests make a bounded number of lines, with counts, and no stack below debug', async () => {
    const pool = new pg.Pool({
      connectionString: `postgres://nobody:x@127.0.0.1:${await closedPort()}/none`,
      connectionTimeoutMillis: 2000,
    });
    pool.on('error', () => {});
    const { logger, lines } = capture('info');
    const down = app(pool, logger, { repeatWindowMs: 60_000 });
    try {
      const M = 60;
      for (let i = 0; i < M; i += 10) {
        const answers = await Promise.all(Array.from({ length: 10 }, (_, j) => put(down, `down/${i + j}`, 1, 'down')));
        for (const r of answers) expect(r.statusCode).toBe(503);
      }
      await down.close(); // ends the window
      const failed = lines.filter((l) => typeof l.msg === 'string' && l.msg.startsWith('request failed'));
      expect(failed).toHaveLength(2);
      expect(failed[0]).toMatchObject({ msg: 'request failed', code: 'unavailable', level: 50 });
      expect(failed[0]!.error).toMatchObject({ message: expect.any(String) });
      expect(failed[1]).toMatchObject({ repeats: M - 1, msg: `request failed … and ${M - 1} more like it in the last 60 s` });
      expect(JSON.stringify(failed)).not.toMatch(/"stack"/);
    } finally {
      await down.close();
      await pool.end();
    }
  });

  test('at debug, the first failure of a window also logs its stack', async () => {
    const pool = new pg.Pool({
      connectionString: `postgres://nobody:x@127.0.0.1:${await closedPort()}/none`,
      connectionTimeoutMillis: 2000,
    });
    pool.on('error', () => {});
    const { logger, lines } = capture('debug');
    const down = app(pool, logger, { repeatWindowMs: 60_000 });
    try {
      for (let i = 0; i < 5; i++) expect((await put(down, `down/${i}`, 1, 'down')).statusCode).toBe(503);
      await down.close();
      const stacks = lines.filter((l) => l.level === 20 && typeof l.msg === 'string' && l.msg.startsWith('request failed'));
      expect(stacks).toHaveLength(1);
      expect((stacks[0]!.err as { stack?: string }).stack).toMatch(/\n\s+at /);
    } finally {
      await down.close();
      await pool.end();
    }
  });
});
