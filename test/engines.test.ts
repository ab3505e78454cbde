// `npm ci` on a supported Node prints no EBADENGINE: no package the lock file installs declares a
// Node range (`engines.node`) that leaves out the Node running the suite (CI runs it on 20 and 24;
// scripts/smoke-node.sh installs on 24). fastify's light-my-request asks for cookie 2, which wants
// Node >= 22: package.json `overrides` pins cookie 1.1.1 (Node >= 18, the same stringifySetCookie).
import { expect, test } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const REPO = join(import.meta.dirname, '..');
const semver = createRequire(import.meta.url)('semver') as { satisfies(version: string, range: string): boolean };

interface Lock {
  packages: Record<string, { version?: string; engines?: { node?: string } | string[] }>;
}

test("no locked package's engines.node leaves out this Node (what npm ci warns of as EBADENGINE)", () => {
  const lock = JSON.parse(readFileSync(join(REPO, 'package-lock.json'), 'utf8')) as Lock;
  const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { engines: { node: string } };
  expect(semver.satisfies(process.version, pkg.engines.node), `${process.version} is not a supported Node`).toBe(true);
  const excluding = Object.entries(lock.packages)
    .filter(([path]) => path !== '')
    .flatMap(([path, m]) => {
      const range = Array.isArray(m.engines) ? undefined : m.engines?.node;
      return range !== undefined && !semver.satisfies(process.version, range) ? [`${path}@${m.version} wants node ${range}`] : [];
    });
  expect(excluding).toEqual([]);
});

test('cookie, under fastify (light-my-request), is the 1.x that declares Node >= 18', () => {
  const lock = JSON.parse(readFileSync(join(REPO, 'package-lock.json'), 'utf8')) as Lock;
  const cookies = Object.entries(lock.packages).filter(([path]) => /(^|\/)node_modules\/cookie$/.test(path));
  expect(cookies.length).toBeGreaterThan(0);
  for (const [path, m] of cookies) expect(`${path}@${m.version}`).toMatch(/@1\.1\.1$/);
});
