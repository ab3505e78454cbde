// The `fencepost` command as users run it (bin/fencepost.js over dist/): flags of every subcommand,
// and start-up failures told in one line naming the setting.
import { describe, expect, inject, test } from 'vitest';
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { closedPort, listenFree } from '../../tools/ports.ts';
import { startPgbouncer } from '../../tools/pgbouncer.ts';
import { clientRoleFor, createTestDatabase } from '../support/db.ts';
import { BIN, REPO, readyUrl } from '../support/proxy.ts';
import { oneLineFailure, run } from '../support/cli.ts';

/** A loopback port held by this process (a free port, of FENCEPOST_PORT_RANGE when set). */
async function occupy(): Promise<{ server: Server; port: number }> {
  const server = createServer();
  return { server, port: await listenFree(server) };
}

describe('flags', () => {
  test('--version prints the version from package.json', () => {
    const { version } = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
    const r = run(['--version']);
    expect(r.status).toBe(0);
    expect(r.stdout.trim()).toBe(`fencepost ${version}`);
  });

  test('serve --help prints usage and exits 0 without starting anything', () => {
    // Nothing listens at this DATABASE_URL: starting would fail with 1.
    const r = run(['serve', '--help'], { DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^usage: fencepost serve /);
    expect(r.stdout).toContain('--port');
  });

  test('migrate --help prints usage and exits 0 without migrating', async () => {
    const db = await createTestDatabase({ migrate: false });
    try {
      const r = run(['migrate', '--help'], { DATABASE_URL: db.url });
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^usage: fencepost migrate/);
      const { rows } = await db.pool.query(`SELECT to_regclass('fencepost.migrations') IS NULL AS untouched`);
      expect(rows[0].untouched).toBe(true);
    } finally {
      await db.drop();
    }
  });

  test.each(['serve', 'migrate', 'elect', 'doctor', 'leader', 'protect', 'unprotect'])(
    '%s with an unknown flag exits 2 with its usage',
    (command) => {
      const r = run([command, '--no-such-flag'], { DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x' });
      expect(r.status, r.stderr).toBe(2);
      expect(r.stderr).toContain('--no-such-flag');
      expect(r.stderr).toContain(`usage: fencepost ${command}`);
    },
  );

  test('elect with its command not after -- exits 2, naming where the command goes; nothing is run', () => {
    const marker = `/tmp/fencepost-elect-no-dashdash-${process.pid}`;
    const r = run(['elect', '--zk', '127.0.0.1:1', '--path', '/demo/nightly', 'touch', marker]);
    expect(r.status, r.stderr).toBe(2);
    expect(r.stderr).toContain('the command goes after --: fencepost elect … -- touch');
    expect(r.stderr).toContain('usage: fencepost elect');
    expect(existsSync(marker)).toBe(false);
  });

  test('serve --port and --host win over PORT and HOST', async () => {
    const db = await createTestDatabase();
    // --port 0: a free port, which the listening line names (logged at info).
    const child = spawn(process.execPath, [BIN, 'serve', '--port', '0', '--host', '127.0.0.1'], {
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url),
        PORT: '1',
        HOST: '0.0.0.0',
        FENCEPOST_LOG_LEVEL: 'info',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    try {
      const url = await readyUrl(child, () => err);
      expect(url).not.toBe('http://127.0.0.1:1');
      expect(err).toContain(`"url":"${url}"`); // bound on --host's address, not HOST's
    } finally {
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      await db.drop();
    }
  });

  test('serve started by npm exec stops when npm is signalled (npm does not pass SIGTERM on): the port is free again', async () => {
    const db = await createTestDatabase();
    // npm → sh -c → node, as `npm exec fencepost serve` and `npm start` run it.
    const npm = spawn('npm', ['exec', '--offline', '-c', `node ${JSON.stringify(BIN)} serve`], {
      cwd: REPO,
      env: { ...process.env, DATABASE_URL: db.url, FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url), PORT: '0', FENCEPOST_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    npm.stderr.on('data', (d: Buffer) => (err += d.toString()));
    try {
      const url = await readyUrl(npm, () => err);
      const up = () =>
        fetch(`${url}/readyz`).then(
          (r) => r.ok,
          () => false,
        );
      npm.kill('SIGTERM');
      // Bounded generously (a loaded box): the watch looks every 0.5 s; a serve left running would answer forever.
      let gone = false;
      for (let i = 0; i < 300 && !gone; i++) {
        gone = !(await up());
        if (!gone) await sleep(100);
      }
      expect(gone, err).toBe(true);
    } finally {
      npm.kill('SIGKILL');
      await db.drop();
    }
  });

  test('a bad --port is refused naming the flag', () => {
    expect(oneLineFailure(run(['serve', '--port', '70000']))).toMatch(
      /^fencepost: invalid configuration: --port: must be between 0 and 65535, got 70000$/,
    );
  });
});

describe('protect', () => {
  test('protects a table and a prefix in the database, lists them, and takes them off; a missing table fails in one line', async () => {
    const db = await createTestDatabase();
    try {
      await db.pool.query('CREATE TABLE public.cli_orders (id int)');
      const env = { DATABASE_URL: db.url };
      const table = run(['protect', 'public.cli_orders', '--fence-key', 'orders/main'], env);
      expect(table.status, table.stderr).toBe(0);
      expect(table.stdout).toContain('protected by fence key "orders/main": cli_orders');
      expect(run(['protect', '--prefix', 'jobs/', '--fence-key', 'jobs'], env).status).toBe(0);
      const list = run(['protect', '--list'], env);
      expect(list.stdout.trim().split('\n').sort()).toEqual(['prefix\tjobs/\tjobs', 'table\tcli_orders\torders/main']);
      await expect(db.pool.query('INSERT INTO public.cli_orders VALUES (1)')).rejects.toMatchObject({ code: 'FP403' });
      // One line of failure after the line naming the database.
      const missing = run(['protect', 'public.nothing', '--fence-key', 'k'], env);
      expect(missing.status).toBe(1);
      expect(missing.stderr.trimEnd().split('\n')).toEqual([
        expect.stringMatching(/^fencepost protect: database .*, from DATABASE_URL$/),
        'fencepost: table public.nothing does not exist',
      ]);
      expect(run(['protect', 'public.cli_orders'], env).status).toBe(2);
      expect(run(['unprotect', 'public.cli_orders'], env).status).toBe(0);
      expect(run(['unprotect', '--prefix', 'jobs/'], env).stdout).toContain('no longer protected');
      expect(run(['protect', '--list'], env).stdout).toBe('nothing is protected\n');
      await db.pool.query('INSERT INTO public.cli_orders VALUES (1)');
    } finally {
      await db.drop();
    }
  });
});

describe('db-url, and the commands beside serve', () => {
  test('db-url prints DATABASE_URL as set, with nothing on stderr (for psql "$(fencepost db-url)")', () => {
    const url = 'postgres://app:pw@db.internal:5433/app?sslmode=require';
    const r = run(['db-url'], { DATABASE_URL: url });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${url}\n`);
    expect(r.stderr).toBe('');
  });

  // Invariant: only `fencepost serve` starts an embedded Postgres; a command beside it never starts a second one.
  test.each([['db-url'], ['migrate'], ['protect', '--list'], ['unprotect', '--prefix', 'jobs/']])(
    '%s with no DATABASE_URL and no serve on the data folder exits 1 in one line saying what to set, and starts no Postgres',
    (...args) => {
      const dir = mkdtempSync(join(tmpdir(), 'fencepost-cli-'));
      try {
        const dataDir = join(dir, 'pgdata');
        const line = oneLineFailure(run(args, { DATABASE_URL: '', FENCEPOST_DATA_DIR: dataDir }));
        expect(line).toMatch(
          new RegExp(
            `^fencepost ${args[0]}: DATABASE_URL is unset and no fencepost serve runs the embedded Postgres on FENCEPOST_DATA_DIR ${dataDir}: ` +
              '(start `fencepost serve` .*, or set DATABASE_URL|a fencepost serve runs one on .*: set FENCEPOST_DATA_DIR=.* \\(or set DATABASE_URL\\))$',
          ),
        );
        expect(existsSync(dataDir)).toBe(false); // nothing initialised, nothing started
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  test('migrate and protect say on stderr which database they used', async () => {
    const db = await createTestDatabase({ migrate: false });
    try {
      const r = run(['migrate'], { DATABASE_URL: db.url });
      expect(r.status, r.stderr).toBe(0);
      const where = new URL(db.url);
      expect(r.stderr).toContain(
        `fencepost migrate: database ${where.hostname}:${where.port} (database ${where.pathname.slice(1)}), from DATABASE_URL\n`,
      );
      expect(r.stderr).not.toContain(`:${where.password}@`); // never the URL itself
      const p = run(['protect', '--list'], { DATABASE_URL: db.url });
      expect(p.status, p.stderr).toBe(0);
      expect(p.stderr).toContain(`fencepost protect: database ${where.hostname}:${where.port}`);
    } finally {
      await db.drop();
    }
  });
});

describe('start-up failures: one line naming the setting and the cause', () => {
  test('a wrong password in DATABASE_URL', async () => {
    const db = await createTestDatabase();
    try {
      const url = new URL(db.url);
      url.password = 'wrong-password';
      const line = oneLineFailure(run(['serve', '--port', '0'], { DATABASE_URL: url.href, FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url) }));
      expect(line).toMatch(/^fencepost: cannot start: DATABASE_URL: .*password authentication failed/);
      expect(line).not.toContain('wrong-password');
    } finally {
      await db.drop();
    }
  });

  test('DATABASE_URL pointing at PgBouncer: the cause, and that the proxy needs Postgres itself', async () => {
    const db = await createTestDatabase();
    const bouncer = await startPgbouncer(db.url, 2);
    try {
      const line = oneLineFailure(
        run(['serve', '--port', '0'], { DATABASE_URL: bouncer.url, FENCEPOST_CLIENT_ROLE: clientRoleFor(db.url) }),
      );
      expect(line).toMatch(
        /^fencepost: cannot start: DATABASE_URL: .*unsupported startup parameter: options \(SQLSTATE 08P01\)\. DATABASE_URL must reach Postgres itself, not a connection pooler/,
      );
    } finally {
      await bouncer.stop();
      await db.drop();
    }
  });

  test('nothing listening at DATABASE_URL', async () => {
    const port = await closedPort();
    const line = oneLineFailure(run(['serve', '--port', '0'], { DATABASE_URL: `postgres://u:secret@127.0.0.1:${port}/x` }));
    expect(line).toBe(`fencepost: cannot start: DATABASE_URL: nothing is listening at 127.0.0.1:${port} (connection refused)`);
  });

  test('the HTTP port in use, found before an embedded Postgres starts', async () => {
    const { server, port } = await occupy();
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-cli-'));
    try {
      const line = oneLineFailure(run(['serve'], { PORT: String(port), FENCEPOST_DATA_DIR: join(dir, 'pgdata') }));
      expect(line).toBe(`fencepost: cannot start: PORT: 127.0.0.1:${port} is already in use (another fencepost serve? set PORT or --port)`);
      expect(existsSync(join(dir, 'pgdata'))).toBe(false); // no Postgres was started (or initialised)
    } finally {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the embedded Postgres's port in use: one line naming FENCEPOST_EMBEDDED_PG_PORT", { timeout: 120_000 }, async () => {
    const { server, port } = await occupy();
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-cli-'));
    chmodSync(dir, 0o755); // as root, Postgres runs as the postgres user
    try {
      const line = oneLineFailure(
        run(['serve', '--port', '0'], {
          DATABASE_URL: '',
          FENCEPOST_DATA_DIR: join(dir, 'pgdata'),
          FENCEPOST_EMBEDDED_PG_PORT: String(port),
        }),
      );
      expect(line).toBe(
        `fencepost: cannot start: FENCEPOST_EMBEDDED_PG_PORT: 127.0.0.1:${port} is already in use (set FENCEPOST_EMBEDDED_PG_PORT, or 0 for a free port)`,
      );
    } finally {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the forgery guard's ZooKeeper unresolvable", () => {
    const guard = {
      FENCEPOST_FORGERY_GUARD: '{"orders/":"/elections/orders"}',
      ZK_AUTH: 'writer:secret',
      DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x',
    };
    const line = oneLineFailure(run(['serve', '--port', '0'], { ...guard, ZK_CONNECT: 'zk.invalid:2181' }));
    expect(line).toMatch(/^fencepost: cannot start: ZK_CONNECT: cannot resolve zk\.invalid \(\w+\)$/);
  });

  test("the forgery guard's ZooKeeper unreachable", async () => {
    const guard = {
      FENCEPOST_FORGERY_GUARD: '{"orders/":"/elections/orders"}',
      ZK_AUTH: 'writer:secret',
      DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x',
    };
    const zk = `127.0.0.1:${await closedPort()}`;
    const line = oneLineFailure(run(['serve', '--port', '0'], { ...guard, ZK_CONNECT: zk }));
    expect(line).toMatch(new RegExp(`^fencepost: cannot start: ZK_CONNECT: ZooKeeper at ${zk} unreachable: `));
  });

  test('FENCEPOST_POOL_SIZE=-1 is out of range (not "not a whole number")', () => {
    expect(oneLineFailure(run(['serve'], { FENCEPOST_POOL_SIZE: '-1' }))).toBe(
      'fencepost: invalid configuration: FENCEPOST_POOL_SIZE: must be between 2 and 1000, got -1',
    );
  });
});

describe('doctor', () => {
  test('shows progress on stderr while it measures, then the advice on stdout', () => {
    const r = run(['doctor', '--zk', inject('zkConnect'), '--window-ms', '1500']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toContain('fencepost doctor: connecting to ZooKeeper at');
    expect(r.stderr).toContain('fencepost doctor: measuring round trips and event-loop stalls for 1500 ms');
    expect(r.stderr).toContain('fencepost doctor: 1 s of 2 s');
    expect(r.stdout).toMatch(/session timeout/i);
  });
});
