// docker-compose.yml is for users with Docker; here it is validated with `docker-compose config`
// (Debian package docker-compose, installed by scripts/test.sh).
import { expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { REPO } from './support/proxy.ts';

const compose = (...args: string[]) =>
  spawnSync('docker-compose', ['-f', join(REPO, 'docker-compose.yml'), ...args], { cwd: REPO, encoding: 'utf8' });

test('docker-compose.yml is valid and runs ZooKeeper, Postgres, the proxy and three writers', () => {
  const check = compose('config', '-q');
  expect(check.error, 'docker-compose is not installed: run scripts/test.sh, which installs it').toBeUndefined();
  expect(check.status, check.stderr).toBe(0);
  const services = compose('config', '--services').stdout.trim().split('\n');
  expect(services).toEqual(expect.arrayContaining(['zookeeper', 'postgres', 'proxy', 'writer-1', 'writer-2', 'writer-3']));
  const full = compose('config').stdout;
  // Writers point at the proxy and ZooKeeper by service name; the proxy at Postgres.
  expect(full).toContain('http://proxy:8080');
  expect(full).toContain('zookeeper:2181');
  expect(full).toContain('postgres://fencepost:fencepost@postgres:5432/fencepost');
  expect(existsSync(join(REPO, 'Dockerfile'))).toBe(true);
});
