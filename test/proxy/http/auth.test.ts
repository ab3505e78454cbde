// Bearer keys: configuration, who may call what, and keys never logged. Open mode binds loopback only.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { FastifyInstance, InjectOptions } from 'fastify';
import pino from 'pino';
import { ConfigError, loadConfig } from '../../../src/proxy/config.ts';
import { digestOf, findKey, parseKeys } from '../../../src/proxy/access/keys.ts';
import { LOG_REDACT, startProxy } from '../../../src/proxy/server.ts';
import { closedPort } from '../../../tools/ports.ts';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { SECRET, bearer, securedApp, testKeys } from '../../support/keys.ts';

const KEYS = JSON.stringify([{ name: 'w', secret: SECRET.writer, fenceKeyPrefixes: [''] }]);

describe('configuration', () => {
  test.each(['0.0.0.0', '::', '10.1.2.3', 'example.com'])('no keys and HOST=%s: refused, naming HOST and FENCEPOST_ALLOW_OPEN', (host) => {
    expect(() => loadConfig({ HOST: host })).toThrow(ConfigError);
    expect(() => loadConfig({ HOST: host })).toThrow(/^HOST: .*FENCEPOST_ALLOW_OPEN=1/);
  });

  test.each(['127.0.0.1', '127.0.0.2', '::1', '[::1]', 'localhost'])('no keys and loopback HOST=%s: allowed', (host) => {
    expect(loadConfig({ HOST: host }).keys).toEqual([]);
  });

  test('a non-loopback HOST is allowed with keys, or without them when FENCEPOST_ALLOW_OPEN=1', () => {
    expect(loadConfig({ HOST: '0.0.0.0', FENCEPOST_KEYS: KEYS }).keys).toHaveLength(1);
    expect(loadConfig({ HOST: '0.0.0.0', FENCEPOST_ALLOW_OPEN: '1' }).allowOpen).toBe(true);
    expect(() => loadConfig({ HOST: '0.0.0.0', FENCEPOST_ALLOW_OPEN: 'yes' })).toThrow(/^FENCEPOST_ALLOW_OPEN/);
  });

  test('startProxy refuses to bind a non-loopback address without keys before it starts anything', async () => {
    const config = { ...loadConfig({ DATABASE_URL: `postgres://x@127.0.0.1:${await closedPort()}/none` }), host: '0.0.0.0' };
    await expect(startProxy(config, pino({ level: 'silent' }))).rejects.toThrow(ConfigError);
  });

  test('keys load from FENCEPOST_KEYS_FILE; only digests are kept; reads need a key by default', () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-keys-'));
    try {
      const file = join(dir, 'keys.json');
      writeFileSync(
        file,
        JSON.stringify({
          keys: [
            { name: 'w', secret: SECRET.writer, fenceKeyPrefixes: ['a/'], pgRole: 'app_writer' },
            { name: 'r', secretSha256: digestOf(SECRET.reader).toString('hex'), readOnly: true },
          ],
        }),
      );
      const c = loadConfig({ FENCEPOST_KEYS_FILE: file });
      expect(c.keys.map((k) => [k.name, k.pgRole, k.readOnly, k.fenceKeyPrefixes])).toEqual([
        ['w', 'app_writer', false, ['a/']],
        ['r', null, true, []],
      ]);
      expect(c.readAccess).toBe('key');
      expect(JSON.stringify(c)).not.toContain(SECRET.writer);
      expect(loadConfig({ FENCEPOST_KEYS_FILE: file, FENCEPOST_READ_ACCESS: 'open' }).readAccess).toBe('open');
      expect(() => loadConfig({ FENCEPOST_KEYS_FILE: join(dir, 'missing.json') })).toThrow(/^FENCEPOST_KEYS_FILE: cannot read/);
      expect(() => loadConfig({ FENCEPOST_KEYS_FILE: file, FENCEPOST_KEYS: KEYS })).toThrow(/^FENCEPOST_KEYS: /);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test.each([
    ['not JSON', '{', /not valid JSON/],
    ['a short secret', JSON.stringify([{ name: 'w', secret: 'short', fenceKeyPrefixes: [''] }]), /secret must be 16/],
    ['an unknown field', JSON.stringify([{ name: 'w', secret: SECRET.writer, prefixes: [''] }]), /unknown field "prefixes"/],
    ['no prefixes on a writer', JSON.stringify([{ name: 'w', secret: SECRET.writer }]), /fenceKeyPrefixes/],
    [
      'a role that is not an identifier',
      JSON.stringify([{ name: 'w', secret: SECRET.writer, fenceKeyPrefixes: [''], pgRole: 'x; DROP ROLE y' }]),
      /pgRole/,
    ],
    [
      'duplicate names',
      JSON.stringify([
        { name: 'w', secret: SECRET.writer, fenceKeyPrefixes: [''] },
        { name: 'w', secret: SECRET.reader, fenceKeyPrefixes: [''] },
      ]),
      /duplicate name/,
    ],
    [
      'a shared secret',
      JSON.stringify([
        { name: 'a', secret: SECRET.writer, fenceKeyPrefixes: [''] },
        { name: 'b', secret: SECRET.writer, fenceKeyPrefixes: [''] },
      ]),
      /same secret/,
    ],
    [
      'both secret forms',
      JSON.stringify([{ name: 'w', secret: SECRET.writer, secretSha256: 'a'.repeat(64), fenceKeyPrefixes: [''] }]),
      /exactly one/,
    ],
  ])('FENCEPOST_KEYS with %s fails fast naming the variable', (_what, json, message) => {
    expect(() => loadConfig({ FENCEPOST_KEYS: json })).toThrow(/^FENCEPOST_KEYS: /);
    expect(() => loadConfig({ FENCEPOST_KEYS: json })).toThrow(message);
  });

  test('forgery guard and transaction settings are validated', () => {
    expect(loadConfig({}).forgeryGuard).toBeNull();
    expect(() => loadConfig({ FENCEPOST_FORGERY_GUARD: '{"a/":"/e"}' })).toThrow(/^ZK_CONNECT: /);
    expect(() => loadConfig({ FENCEPOST_FORGERY_GUARD: '{"a/":"e/"}', ZK_CONNECT: 'z:2181' })).toThrow(/^FENCEPOST_FORGERY_GUARD: /);
    expect(() => loadConfig({ FENCEPOST_FORGERY_GUARD: '{"a/":"/e/a"}', ZK_CONNECT: 'z:2181' })).toThrow(/^ZK_AUTH: /);
    expect(() => loadConfig({ FENCEPOST_FORGERY_GUARD: '{"a/":"/e/a"}', ZK_CONNECT: 'z:2181', ZK_AUTH: 'no-password' })).toThrow(
      /^ZK_AUTH: /,
    );
    expect(loadConfig({ FENCEPOST_FORGERY_GUARD: '{"a/":"/e/a"}', ZK_CONNECT: 'z:2181', ZK_AUTH: 'elector:s3:cret' }).forgeryGuard).toEqual(
      {
        zkConnect: 'z:2181',
        mappings: [{ prefix: 'a/', electionPath: '/e/a' }],
        electionAuth: { user: 'elector', password: 's3:cret' },
      },
    );
    expect(() => loadConfig({ FENCEPOST_TX_MAX_STATEMENTS: '0' })).toThrow(/^FENCEPOST_TX_MAX_STATEMENTS: /);
    expect(() => loadConfig({ FENCEPOST_REQUEST_TIMEOUT_MS: 'soon' })).toThrow(/^FENCEPOST_REQUEST_TIMEOUT_MS: /);
  });
});

describe('bearer key matching', () => {
  const keys = parseKeys(KEYS);
  test.each([
    [`Bearer ${SECRET.writer}`, 'w'],
    [`bearer ${SECRET.writer}`, 'w'],
    [`Bearer   ${SECRET.writer} `, 'w'],
    [`Bearer ${SECRET.writer}x`, null],
    [`Bearer ${SECRET.writer.slice(0, -1)}`, null],
    [`Basic ${SECRET.writer}`, null],
    [SECRET.writer, null],
    ['Bearer ', null],
    [`Bearer ${'x'.repeat(5000)}`, null],
  ])('%j matches %s', (header, name) => {
    expect(findKey(keys, header)?.name ?? null).toBe(name);
  });
});

describe('who may call what', () => {
  let db: TestDatabase;
  let app: FastifyInstance;
  let openReads: FastifyInstance;
  beforeAll(async () => {
    db = await createTestDatabase();
    app = securedApp(db.pool, 'unused_role');
    openReads = securedApp(db.pool, 'unused_role', { auth: { keys: testKeys('unused_role'), readAccess: 'open' } });
  });
  afterAll(async () => {
    await app.close();
    await openReads.close();
    await db.drop();
  });

  const put = (url: string, headers: Record<string, string> = {}): InjectOptions => ({
    method: 'PUT',
    url,
    headers: { 'fencing-token': '1', ...headers },
    payload: 'v',
  });

  test.each([
    ['PUT object, no key', put('/v1/objects/w%2F1'), 401],
    ['PUT object, wrong key', put('/v1/objects/w%2F1', bearer('wrong-key-wrong-key')), 401],
    ['PUT object, read-only key', put('/v1/objects/w%2F1', bearer(SECRET.reader)), 403],
    ['PUT object, writer key outside prefixes', put('/v1/objects/x%2F1', bearer(SECRET.writer)), 403],
    ['PUT object, writer key, Fence-Key outside prefixes', put('/v1/objects/w%2F1', { ...bearer(SECRET.writer), 'fence-key': 'o/1' }), 403],
    [
      'PUT object, writer key, object key outside prefixes behind an allowed Fence-Key',
      put('/v1/objects/o%2F1', { ...bearer(SECRET.writer), 'fence-key': 'w/1' }),
      403,
    ],
    ['PUT object, writer key', put('/v1/objects/w%2F1', bearer(SECRET.writer)), 200],
    ['PUT fence, other writer key', put('/v1/fences/o%2F1', bearer(SECRET.other)), 200],
    ['DELETE object, no key', { method: 'DELETE', url: '/v1/objects/w%2F1', headers: { 'fencing-token': '1' } }, 401],
    ['GET object, no key', { url: '/v1/objects/w%2F1' }, 401],
    ['GET object, read-only key', { url: '/v1/objects/w%2F1', headers: bearer(SECRET.reader) }, 200],
    ['GET object, writer key', { url: '/v1/objects/w%2F1', headers: bearer(SECRET.writer) }, 200],
    ['GET stats, no key', { url: '/v1/stats' }, 401],
    ['GET fences, read-only key', { url: '/v1/fences', headers: bearer(SECRET.reader) }, 200],
    ['GET unknown route, no key', { url: '/nothing' }, 401],
    ['GET unknown route, read-only key', { url: '/nothing', headers: bearer(SECRET.reader) }, 404],
    ['POST transaction, no key', { method: 'POST', url: '/v1/transactions', payload: '{}' }, 401],
    ['GET healthz, no key', { url: '/healthz' }, 200],
    ['GET readyz, wrong key', { url: '/readyz', headers: bearer('wrong-key-wrong-key') }, 200],
  ] as [string, InjectOptions, number][])('%s → %i', async (_what, req, status) => {
    const res = await app.inject(req);
    expect(res.statusCode, res.body).toBe(status);
  });

  test('with FENCEPOST_READ_ACCESS=open reads need no key but writes still do', async () => {
    expect((await openReads.inject({ url: '/v1/stats' })).statusCode).toBe(200);
    expect((await openReads.inject(put('/v1/objects/w%2F2'))).statusCode).toBe(401);
  });

  test('keys never reach the log', async () => {
    let out = '';
    const sink = new Writable({ write: (chunk, _enc, cb) => ((out += chunk.toString()), cb()) });
    const logger = pino({ level: 'trace', redact: LOG_REDACT }, sink);
    const logged = securedApp(db.pool, 'unused_role', { logger });
    try {
      for (const secret of [SECRET.writer, SECRET.reader, 'a-wrong-key-0123456789']) {
        await logged.inject(put('/v1/objects/w%2F3', bearer(secret)));
        await logged.inject(put('/v1/objects/x%2F3', bearer(secret)));
        await logged.inject({ method: 'POST', url: '/v1/transactions', headers: bearer(secret), payload: '{' });
      }
      // Whatever logs a request's headers gets them redacted.
      logger.info(
        { req: { headers: { authorization: `Bearer ${SECRET.writer}` } }, headers: { authorization: `Bearer ${SECRET.reader}` } },
        'request',
      );
    } finally {
      await logged.close();
    }
    expect(out).toContain('read-only key refused a write');
    expect(out).toContain('[redacted]');
    for (const s of Object.values(SECRET)) expect(out).not.toContain(s);
    expect(out).not.toContain('a-wrong-key-0123456789');
  });
});
