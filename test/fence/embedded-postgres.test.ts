// The embedded Postgres (no DATABASE_URL): two proxies on one machine, each with its own cluster on
// a free port; a second proxy on the same data folder is refused in one line.
import { afterAll, describe, expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import pg from 'pg';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { defaultDataDir } from '../../src/proxy/config.ts';
import { REPO, spawnProxy, type ProxyProcess } from '../support/proxy.ts';

const dir = mkdtempSync(join(tmpdir(), 'fencepost-two-'));
chmodSync(dir, 0o755); // embedded Postgres runs as the postgres user under root
const running: ProxyProcess[] = [];
const checkouts: string[] = [];

afterAll(async () => {
  await Promise.all(running.map((p) => p.stop()));
  for (const root of checkouts) rmSync(dirname(defaultDataDir(root)), { recursive: true, force: true });
  rmSync(dir, { recursive: true, force: true });
});

/** No DATABASE_URL, no embedded port: the defaults under test. */
const EMBEDDED = { DATABASE_URL: '', FENCEPOST_EMBEDDED_PG_PORT: '' };

async function start(env: Record<string, string>, bin?: string): Promise<ProxyProcess> {
  const p = await spawnProxy({ ...EMBEDDED, ...env }, 120_000, 'strict', bin ? { bin } : {});
  running.push(p);
  return p;
}

/** Another checkout of this package, as `npm ci && npm run build` would leave it (node_modules shared). */
function copyCheckout(name: string): string {
  const root = join(dir, name);
  mkdirSync(root);
  for (const entry of ['bin', 'dist', 'migrations', 'package.json']) cpSync(join(REPO, entry), join(root, entry), { recursive: true });
  symlinkSync(join(REPO, 'node_modules'), join(root, 'node_modules'));
  checkouts.push(root);
  return root;
}

async function put(url: string, key: string, body: string): Promise<number> {
  return (await fetch(`${url}/v1/objects/${key}`, { method: 'PUT', headers: { 'fencing-token': '1' }, body })).status;
}

describe('two proxies on one machine', () => {
  test('with different FENCEPOST_DATA_DIR both start, each on its own cluster (embedded port picked free)', async () => {
    const [a, b] = await Promise.all([
      start({ FENCEPOST_DATA_DIR: join(dir, 'a', 'pgdata') }),
      start({ FENCEPOST_DATA_DIR: join(dir, 'b', 'pgdata') }),
    ]);
    expect(await put(a.url, 'only-in-a', 'x')).toBe(200);
    expect((await fetch(`${a.url}/v1/objects/only-in-a`)).status).toBe(200);
    expect((await fetch(`${b.url}/v1/objects/only-in-a`)).status).toBe(404);
    // Beside a running serve, migrate and protect use its cluster (the URL it recorded, 0600, in its data folder) and say so.
    const aData = join(dir, 'a', 'pgdata');
    const env = { ...process.env, ...EMBEDDED, FENCEPOST_DATA_DIR: aData, FENCEPOST_LOG_LEVEL: 'warn' };
    const urlFile = join(aData, 'postgres.url');
    expect(statSync(urlFile).mode & 0o777).toBe(0o600);
    // serve said where its data and its URL file are when it started.
    expect(a.output()).toContain(`embedded Postgres running: data folder ${aData}, superuser URL in ${urlFile}`);
    const fencepost = (args: string[], e: NodeJS.ProcessEnv = env) =>
      spawnSync(process.execPath, [join(REPO, 'bin', 'fencepost.js'), ...args], { env: e, encoding: 'utf8', timeout: 60_000 });
    const u = fencepost(['db-url']);
    expect(u.status, u.stderr).toBe(0);
    expect(u.stdout).toBe(readFileSync(urlFile, 'utf8'));
    expect(u.stderr).toBe('');
    const m = fencepost(['migrate']);
    expect(m.status, m.stderr).toBe(0);
    expect(m.stderr).toMatch(
      new RegExp(
        `^fencepost migrate: database 127\\.0\\.0\\.1:\\d+ \\(database postgres\\), the embedded Postgres fencepost serve runs on ${aData}$`,
        'm',
      ),
    );
    const l = fencepost(['protect', '--list']);
    expect(l.status, l.stderr).toBe(0);
    // Given another folder (here this checkout's default), a command names the folder a serve runs on, and starts nothing there.
    const elsewhere = fencepost(['protect', '--list'], { ...env, FENCEPOST_DATA_DIR: '' });
    expect(elsewhere.status, elsewhere.stderr).toBe(1);
    expect(elsewhere.stderr).toContain(
      `fencepost protect: DATABASE_URL is unset and no fencepost serve runs the embedded Postgres on this checkout's default data folder ${defaultDataDir()}: a fencepost serve runs one on `,
    );
    expect(elsewhere.stderr).toContain(aData);
    expect(existsSync(join(defaultDataDir(), 'postmaster.pid'))).toBe(false);
    // doctor with neither --zk nor DATABASE_URL checks that cluster (a lone primary: nothing to warn of).
    const d = spawnSync(process.execPath, [join(REPO, 'bin', 'fencepost.js'), 'doctor', '--json'], {
      env,
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(d.status, d.stderr).toBe(0);
    expect(JSON.parse(d.stdout)).toHaveProperty('postgres');
    expect((await fetch(`${a.url}/v1/objects/only-in-a`)).status).toBe(200);
  });

  test('with the SQL endpoint on, the embedded Postgres takes every connection the proxy may open: no budget warning', async () => {
    const c = await start({ FENCEPOST_DATA_DIR: join(dir, 'c', 'pgdata'), FENCEPOST_PGWIRE_PORT: '0', FENCEPOST_LOG_LEVEL: 'warn' });
    expect(await put(c.url, 'with-endpoint', 'x')).toBe(200);
    expect(c.output()).not.toContain('Postgres connections');
  });

  test("the embedded superuser's unqualified tables go to public, never into the fence's own schema", async () => {
    // Invariant: the superuser is called `fencepost` like the fence's schema; "$user" must not catch a user's tables.
    await start({ FENCEPOST_DATA_DIR: join(dir, 'd', 'pgdata'), FENCEPOST_LOG_LEVEL: 'warn' });
    const url = readFileSync(join(dir, 'd', 'pgdata', 'postgres.url'), 'utf8').trim();
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query('CREATE TABLE unqualified_orders (id int)');
      const { rows } = await client.query<{ schema: string }>(
        "SELECT relnamespace::regnamespace::text AS schema FROM pg_class WHERE relname = 'unqualified_orders'",
      );
      expect(rows).toEqual([{ schema: 'public' }]);
    } finally {
      await client.end();
    }
  });

  test('from two checkouts with the default data folder both start; a second in the same checkout is refused in one line', async () => {
    const one = copyCheckout('checkout-one');
    const two = copyCheckout('checkout-two');
    expect(defaultDataDir(one)).not.toBe(defaultDataDir(two));
    const defaults = { FENCEPOST_DATA_DIR: '' };
    const [a, b] = await Promise.all([
      start(defaults, join(one, 'bin', 'fencepost.js')),
      start(defaults, join(two, 'bin', 'fencepost.js')),
    ]);
    expect(await put(a.url, 'checkout-one', 'x')).toBe(200);
    expect((await fetch(`${b.url}/v1/objects/checkout-one`)).status).toBe(404);

    // Same checkout, another HTTP port: the data folder is taken.
    const env = { ...process.env, ...EMBEDDED, FENCEPOST_DATA_DIR: '', PORT: '0', FENCEPOST_LOG_LEVEL: 'warn' };
    const r = spawnSync(process.execPath, [join(one, 'bin', 'fencepost.js'), 'serve'], { env, encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stderr).toBe(1);
    const lines = r.stderr.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{'));
    expect(lines).toEqual([
      expect.stringMatching(/^fencepost: cannot start: FENCEPOST_DATA_DIR: .* is in use by a running Postgres \(pid \d+\)/),
    ]);
    // fencepost migrate on that folder uses the running cluster instead.
    const m = spawnSync(process.execPath, [join(one, 'bin', 'fencepost.js'), 'migrate'], { env, encoding: 'utf8', timeout: 60_000 });
    expect(m.status, m.stderr).toBe(0);
    // The first proxy is untouched.
    expect((await fetch(`${a.url}/v1/objects/checkout-one`)).status).toBe(200);
    // Two initdb runs side by side, then three more processes: about 20 s on a quiet box, more than
    // a minute on a loaded one (a CI run beside another suite took 60 s).
  }, 240_000);
});
