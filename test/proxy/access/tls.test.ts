// HTTPS with FENCEPOST_TLS_CERT / FENCEPOST_TLS_KEY: a real `fencepost serve` with certificates made
// by openssl, reloaded on SIGHUP.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, loadConfig } from '../../../src/proxy/config.ts';
import { TlsMaterial } from '../../../src/proxy/access/tls.ts';
import { createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { BIN, httpsGet, spawnProxy, type ProxyProcess } from '../../support/proxy.ts';
import { makeCert as makeTlsCert, replaceFile } from '../../support/tls.ts';

const dir = mkdtempSync(join(tmpdir(), 'fencepost-tls-'));

const makeCert = (name: string) => makeTlsCert(dir, name);

/** Polls until `check` holds (the reload happens when the signal is handled); fails with the last value. */
async function until<T>(read: () => Promise<T>, check: (v: T) => boolean): Promise<T> {
  let last = await read();
  for (let i = 0; i < 200 && !check(last); i++) {
    await sleep(50);
    last = await read();
  }
  return last;
}

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('HTTPS on the proxy process', () => {
  let db: TestDatabase;
  let proxy: ProxyProcess;
  const first = makeCert('first');
  const second = makeCert('second');
  const live = { cert: join(dir, 'live.cert.pem'), key: join(dir, 'live.key.pem') };
  const ca = [first.pem, second.pem];

  beforeAll(async () => {
    db = await createTestDatabase();
    replaceFile(first.cert, live.cert);
    replaceFile(first.key, live.key);
    proxy = await spawnProxy({ DATABASE_URL: db.url, FENCEPOST_TLS_CERT: live.cert, FENCEPOST_TLS_KEY: live.key }, 60_000, 'strict', {
      https: { ca },
    });
  });
  afterAll(async () => {
    expect(await proxy?.stop()).toBe(0);
    await db?.drop();
  });

  test('serves HTTPS with the configured certificate', async () => {
    expect(proxy.url).toMatch(/^https:\/\//);
    const res = await httpsGet(`${proxy.url}/readyz`, ca);
    expect(res.status).toBe(200);
    expect(res.fingerprint256).toBe(first.fingerprint);
  });

  test('answers nothing over plain HTTP on the same port (HTTPS only)', async () => {
    const plain = proxy.url.replace('https://', 'http://');
    await expect(fetch(`${plain}/readyz`)).rejects.toThrow();
  });

  test('SIGHUP after the files are replaced: new connections get the new certificate', async () => {
    replaceFile(second.cert, live.cert);
    replaceFile(second.key, live.key);
    proxy.child.kill('SIGHUP');
    const res = await until(
      () => httpsGet(`${proxy.url}/readyz`, ca),
      (r) => r.fingerprint256 === second.fingerprint,
    );
    expect(res.fingerprint256).toBe(second.fingerprint);
    expect(res.status).toBe(200);
  });

  test('SIGHUP with a broken certificate file keeps serving the previous certificate and logs an error', async () => {
    writeFileSync(live.cert, 'not a certificate\n');
    proxy.child.kill('SIGHUP');
    await until(
      async () => proxy.output(),
      (out) => out.includes('TLS reload failed'),
    );
    expect(proxy.output()).toContain('TLS reload failed');
    expect(proxy.output()).toContain('FENCEPOST_TLS_CERT');
    const res = await httpsGet(`${proxy.url}/readyz`, ca);
    expect(res.status).toBe(200);
    expect(res.fingerprint256).toBe(second.fingerprint);
    expect(proxy.child.exitCode).toBeNull();
  });
});

describe('TLS settings', () => {
  test.each([
    ['FENCEPOST_TLS_CERT', { FENCEPOST_TLS_KEY: '/k.pem' }],
    ['FENCEPOST_TLS_KEY', { FENCEPOST_TLS_CERT: '/c.pem' }],
  ])('one of the pair without the other fails naming the missing %s', (missing, env) => {
    expect(() => loadConfig(env)).toThrow(ConfigError);
    expect(() => loadConfig(env)).toThrow(new RegExp(`^${missing}:`));
  });

  test("a key that is not the certificate's fails naming FENCEPOST_TLS_KEY", () => {
    const a = makeCert('pair-a');
    const b = makeCert('pair-b');
    expect(() => TlsMaterial.load({ certFile: a.cert, keyFile: b.key })).toThrow(/^FENCEPOST_TLS_KEY: .*is not the key of the certificate/);
    expect(() => TlsMaterial.load({ certFile: join(dir, 'missing.pem'), keyFile: a.key })).toThrow(/^FENCEPOST_TLS_CERT: cannot read/);
    expect(TlsMaterial.load({ certFile: a.cert, keyFile: a.key }).fingerprint()).toBe(a.fingerprint);
  });

  test('fencepost serve with an unreadable certificate exits 1 with one line naming FENCEPOST_TLS_CERT', () => {
    const r = spawnSync(process.execPath, [BIN, 'serve'], {
      env: {
        ...process.env,
        DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x',
        FENCEPOST_TLS_CERT: join(dir, 'missing.pem'),
        FENCEPOST_TLS_KEY: join(dir, 'missing.key'),
      },
      encoding: 'utf8',
    });
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n')).toEqual([
      expect.stringMatching(/^fencepost: invalid configuration: FENCEPOST_TLS_CERT: cannot read /),
    ]);
  });
});
