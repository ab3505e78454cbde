// Shared by the security tests: an app with bearer keys, Postgres roles for them, raw HTTP.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { inject } from 'vitest';
import { buildApp, type AppOptions } from '../../src/proxy/http/app.ts';
import { parseKeys } from '../../src/proxy/access/keys.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { clientRoleFor } from './db.ts';

export const SECRET = {
  writer: 'writer-secret-7f3a9c1e5b',
  reader: 'reader-secret-0d2b4f6a8c',
  norole: 'norole-secret-9e8d7c6b5a',
  other: 'other-secret-1a2b3c4d5e6f',
};

export const bearer = (secret: string) => ({ authorization: `Bearer ${secret}` });

/** A role name unique to this run (roles are cluster-wide). */
export function uniqueRole(what: string): string {
  return `fp_${what}_${randomBytes(4).toString('hex')}`;
}

/** Keys: `writer` (prefixes w/ and shared/, role), `reader` (read-only), `norole`, `other` (prefix o/). */
export function testKeys(role: string) {
  return parseKeys(
    JSON.stringify({
      keys: [
        { name: 'writer', secret: SECRET.writer, fenceKeyPrefixes: ['w/', 'shared/'], pgRole: role },
        { name: 'reader', secret: SECRET.reader, readOnly: true },
        { name: 'norole', secret: SECRET.norole, fenceKeyPrefixes: ['w/'] },
        { name: 'other', secret: SECRET.other, fenceKeyPrefixes: ['o/'], pgRole: role },
      ],
    }),
  );
}

export function securedApp(pool: pg.Pool, role: string, opts: Partial<AppOptions> = {}): FastifyInstance {
  return buildApp({
    store: new FenceStore(pool, STORE_DEFAULTS),
    bodyLimitBytes: 64 * 1024,
    auth: { keys: testKeys(role), readAccess: 'key' },
    transactions: { clientRole: clientRoleFor(pool), maxStatements: 8, statementTimeoutMs: 300, retries: 3 },
    ...opts,
  });
}

/** Runs SQL as the run's admin (superuser) on the server, outside any test database. */
export async function adminQuery(sql: string): Promise<void> {
  const c = new pg.Client({ connectionString: inject('databaseUrl') });
  await c.connect();
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

/**
 * Writes `parts` to a raw TCP connection to `url`, waiting `gapMs` between them, and resolves with
 * everything the server sent back once it closes the connection (or after `maxMs`).
 */
export async function rawHttp(url: string, parts: (string | Buffer)[], gapMs = 0, maxMs = 10_000): Promise<string> {
  const { hostname, port } = new URL(url);
  return await new Promise((resolve, reject) => {
    const sock = connect(Number(port), hostname);
    let out = '';
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve(out);
    };
    const timer = setTimeout(finish, maxMs);
    sock.on('data', (d) => (out += d.toString('latin1')));
    sock.on('close', finish);
    sock.on('error', (e) => (out ? finish() : reject(e)));
    sock.on('connect', async () => {
      for (const p of parts) {
        if (done || sock.destroyed) return;
        sock.write(p);
        if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
      }
    });
  });
}
