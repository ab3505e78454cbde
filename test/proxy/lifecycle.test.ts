// Start-up, shutdown and restart of real `fencepost serve` processes.
import { describe, expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { loadConfig, ConfigError } from '../../src/proxy/config.ts';
import { DEFINITIONS_APPLIED, loadMigrations, migrate } from '../../src/fence/migrate.ts';
import { startPostgres } from '../../tools/postgres.ts';
import { createTestDatabase } from '../support/db.ts';
import { BIN, spawnProxy, testApp } from '../support/proxy.ts';
import { createPool } from '../../src/proxy/server.ts';

describe('durability and graceful shutdown', () => {
  test('every write answered 200 before and during SIGTERM is still there after a restart of proxy and embedded Postgres', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-durable-'));
    chmodSync(dir, 0o755); // embedded Postgres runs as the postgres user under root
    const env = { FENCEPOST_DATA_DIR: join(dir, 'pg'), FENCEPOST_EMBEDDED_PG_PORT: '0' };
    try {
      const first = await spawnProxy(env);
      const acked = new Map<string, string>();
      let stopping: Promise<number | null> | null = null;
      // 200 writes from 16 clients; SIGTERM goes out once 50 are acknowledged, with more in flight.
      const keys = Array.from({ length: 200 }, (_, i) => `durable-${i}`);
      const client = async (c: number) => {
        for (let i = c; i < keys.length; i += 16) {
          const body = `value-${i}`;
          const res = await fetch(`${first.url}/v1/objects/${keys[i]}`, { method: 'PUT', headers: { 'fencing-token': '1' }, body }).catch(
            () => null,
          );
          if (res?.status === 200) acked.set(keys[i]!, body);
          else if (res && res.status !== 503) throw new Error(`unexpected ${res.status}`);
          if (acked.size >= 50 && !stopping) stopping = first.stop('SIGTERM');
        }
      };
      await Promise.all(Array.from({ length: 16 }, (_, c) => client(c)));
      expect(await (stopping ?? first.stop('SIGTERM'))).toBe(0);
      expect(acked.size).toBeGreaterThanOrEqual(50);
      // Postgres was stopped cleanly with the proxy.
      expect(existsSync(join(dir, 'pg', 'postmaster.pid'))).toBe(false);

      const second = await spawnProxy(env);
      try {
        for (const [key, body] of acked) {
          const res = await fetch(`${second.url}/v1/objects/${key}`);
          expect(res.status, key).toBe(200);
          expect(await res.text()).toBe(body);
        }
        // Stats survive too: exactly the acknowledged writes, plus any whose reply was cut off.
        const stats = (await (await fetch(`${second.url}/v1/stats`)).json()) as { accepted: number };
        expect(stats.accepted).toBeGreaterThanOrEqual(acked.size);
      } finally {
        expect(await second.stop('SIGINT')).toBe(0);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('durability across a Postgres crash', () => {
  test('every write answered 200 survives an immediate shutdown (no checkpoint) and WAL recovery', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-crash-'));
    chmodSync(dir, 0o755);
    let pg = await startPostgres({ dataDir: join(dir, 'pg') });
    try {
      const pool = createPool(pg.url, 4);
      await migrate(pool);
      const app = testApp(pool);
      const acked: string[] = [];
      await Promise.all(
        Array.from({ length: 8 }, async (_, c) => {
          for (let i = c; i < 200; i += 8) {
            const res = await app.inject({
              method: 'PUT',
              url: `/v1/objects/crash-${i}`,
              headers: { 'fencing-token': '1' },
              payload: `v${i}`,
            });
            if (res.statusCode === 200) acked.push(`crash-${i}`);
          }
        }),
      );
      expect(acked).toHaveLength(200);
      await app.close();
      await pool.end();
      await pg.crash();
      pg = await startPostgres({ dataDir: join(dir, 'pg') });
      const after = createPool(pg.url, 2);
      try {
        const { rows } = await after.query<{ key: string; body: Buffer }>('SELECT key, body FROM fencepost.objects');
        const stored = new Map(rows.map((r) => [r.key, r.body.toString()]));
        for (const key of acked) expect(stored.get(key), key).toBe(`v${key.slice('crash-'.length)}`);
      } finally {
        await after.end();
      }
    } finally {
      await pg.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('migrations', () => {
  test('four instances migrating one database at once apply each migration exactly once', async () => {
    const db = await createTestDatabase({ migrate: false });
    const pools = Array.from({ length: 4 }, () => new pg.Pool({ connectionString: db.url, max: 2 }));
    try {
      const applied = await Promise.all(pools.map((p) => migrate(p)));
      // Each migration and the current definitions, each exactly once across the four.
      expect(applied.flat().sort()).toEqual([...loadMigrations().map((m) => m.name), DEFINITIONS_APPLIED].sort());
      const { rows } = await db.pool.query('SELECT id FROM fencepost.migrations ORDER BY id');
      expect(rows.map((r) => r.id)).toEqual(loadMigrations().map((m) => m.id));
      expect(await migrate(db.pool)).toEqual([]);
    } finally {
      await Promise.all(pools.map((p) => p.end()));
      await db.drop();
    }
  });

  test('a database migrated by an older version (bookkeeping in public) is taken over, nothing applied twice', async () => {
    const old = await createTestDatabase();
    try {
      await old.pool.query(
        'ALTER TABLE fencepost.migrations SET SCHEMA public; ALTER TABLE public.migrations RENAME TO fencepost_migrations',
      );
      expect(await migrate(old.pool)).toEqual([]);
      const { rows } = await old.pool.query(
        `SELECT to_regclass('public.fencepost_migrations') IS NOT NULL AS old, to_regclass('fencepost.migrations') IS NOT NULL AS new`,
      );
      expect(rows[0]).toEqual({ old: false, new: true });
    } finally {
      await old.drop();
    }
  });

  test('fencepost migrate applies migrations to DATABASE_URL', async () => {
    const db = await createTestDatabase({ migrate: false });
    try {
      const r = spawnSync(process.execPath, [BIN, 'migrate'], { env: { ...process.env, DATABASE_URL: db.url }, encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
      const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM fencepost.migrations');
      expect(rows[0].n).toBe(loadMigrations().length);
    } finally {
      await db.drop();
    }
  });
});

describe('configuration', () => {
  test.each([
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['FENCEPOST_BODY_LIMIT_BYTES', '-1'],
    ['FENCEPOST_POOL_SIZE', '1'],
    ['DATABASE_URL', 'mysql://x'],
    ['FENCEPOST_LOG_LEVEL', 'loud'],
    ['FENCEPOST_PROTECTED_PREFIX_REFRESH_MS', '10'],
  ])('a bad %s (%j) fails fast naming the variable', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(name);
  });

  test('fencepost serve exits 1 with the variable name on bad config, before touching any database', () => {
    const r = spawnSync(process.execPath, [BIN, 'serve'], { env: { ...process.env, PORT: 'nope' }, encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('PORT');
  });

  test('defaults are documented values', () => {
    const c = loadConfig({});
    expect(c).toMatchObject({ port: 8080, host: '127.0.0.1', bodyLimitBytes: 1048576, databaseUrl: null });
  });
});

describe('durability settings', () => {
  test('proxy connections commit synchronously even when the database default is off', async () => {
    const db = await createTestDatabase();
    const name = new URL(db.url).pathname.slice(1);
    try {
      await db.pool.query(`ALTER DATABASE ${name} SET synchronous_commit = off`);
      const pool = createPool(db.url, 2);
      try {
        const { rows } = await pool.query<{ synchronous_commit: string }>('SHOW synchronous_commit');
        expect(rows[0]!.synchronous_commit).toBe('on');
      } finally {
        await pool.end();
      }
    } finally {
      await db.drop();
    }
  });
});

describe('bounded waits', () => {
  test('a write stuck behind a fence row lock past FENCEPOST_STATEMENT_TIMEOUT_MS gets 503 unavailable and writes nothing', async () => {
    const db = await createTestDatabase();
    const pool = createPool(db.url, 4, { statementTimeoutMs: 300 });
    const app = testApp(pool);
    const holder = await db.pool.connect();
    try {
      expect((await app.inject({ method: 'PUT', url: '/v1/fences/locked', headers: { 'fencing-token': '5' } })).statusCode).toBe(200);
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM fencepost.fences WHERE fence_key = 'locked' FOR UPDATE`);
      const res = await app.inject({
        method: 'PUT',
        url: '/v1/objects/stuck',
        headers: { 'fencing-token': '6', 'fence-key': 'locked' },
        payload: 'x',
      });
      expect(res.statusCode).toBe(503);
      expect(res.json().error).toBe('unavailable');
      await holder.query('ROLLBACK');
      expect((await app.inject({ url: '/v1/objects/stuck' })).statusCode).toBe(404);
      expect((await app.inject({ url: '/v1/fences/locked' })).json().highestToken).toBe('5');
      // Once the lock is gone the same write goes through.
      expect(
        (
          await app.inject({
            method: 'PUT',
            url: '/v1/objects/stuck',
            headers: { 'fencing-token': '6', 'fence-key': 'locked' },
            payload: 'x',
          })
        ).statusCode,
      ).toBe(200);
    } finally {
      holder.release();
      await app.close();
      await pool.end();
      await db.drop();
    }
  });
});
