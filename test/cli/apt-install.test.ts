// scripts/apt-install.sh, the apt-get of scripts/setup.sh (scripts/demo.sh, scripts/test.sh) and
// scripts/zookeeper.sh: on a shared machine another apt-get may hold the package lock; the install
// waits for it, bounded, saying so, instead of failing at once (exit 100). apt-get and pgrep are
// stand-ins here: the real lock is the machine's, and other users' installs must not wait on a test.
import { afterAll, expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO } from '../support/proxy.ts';

const dir = mkdtempSync(join(tmpdir(), 'fencepost-apt-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const held = join(dir, 'held');
const calls = join(dir, 'calls');
// apt-get as apt says a held lock (update: at once; install: after DPkg::Lock::Timeout), pgrep naming the holder.
writeFileSync(
  join(dir, 'apt-get'),
  `#!/bin/bash\necho "$*" >> ${calls}\nif [ -e ${held} ]; then echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2; exit 100; fi\n`,
  { mode: 0o755 },
);
writeFileSync(join(dir, 'pgrep'), `#!/bin/bash\n[ -e ${held} ] && echo "4242 apt-get" && exit 0\nexit 1\n`, { mode: 0o755 });

function install(env: Record<string, string>, releaseAfterS?: number) {
  rmSync(calls, { force: true });
  writeFileSync(held, '');
  const release = releaseAfterS === undefined ? '' : `(sleep ${releaseAfterS}; rm -f ${held}) & `;
  return spawnSync(
    'bash',
    [
      '-c',
      `set -euo pipefail; say() { printf '[setup] %s\\n' "$*" >&2; }; SUDO=""; source scripts/apt-install.sh; ${release}apt_install zookeeper`,
    ],
    { cwd: REPO, env: { ...process.env, PATH: `${dir}:${process.env.PATH ?? ''}`, ...env }, encoding: 'utf8', timeout: 30_000 },
  );
}

test('another apt-get holding the lock: the install says so, waits for it, and goes on once it is free', () => {
  const r = install({ APT_LOCK_TIMEOUT_S: '20', APT_LOCK_POLL_S: '0.2' }, 1);
  expect(r.status, r.stderr).toBe(0);
  expect(r.stderr).toContain(
    '[setup] another package manager runs (apt-get (pid 4242)): waiting up to 20 s for the package lock (APT_LOCK_TIMEOUT_S)',
  );
  const lines = readFileSync(calls, 'utf8').trim().split('\n');
  // update tried again until the lock was free; install waits on the dpkg lock itself (DPkg::Lock::Timeout).
  expect(lines.length).toBeGreaterThan(2);
  expect(lines.at(-1)).toBe('-o DPkg::Lock::Timeout=20 install -y -qq --no-install-recommends zookeeper');
  expect(lines.every((l) => /^-o DPkg::Lock::Timeout=\d+ (update|install) /.test(l))).toBe(true);
});

test('a lock held past APT_LOCK_TIMEOUT_S: apt-get exit 100 and a line saying it gave up, naming the holder and the setting', () => {
  const r = install({ APT_LOCK_TIMEOUT_S: '1', APT_LOCK_POLL_S: '0.2' });
  expect(r.status).toBe(100);
  expect(r.stderr).toContain(
    '[setup] gave up after 1 s: the package lock is still held (apt-get (pid 4242)); run this again once it is free, or set APT_LOCK_TIMEOUT_S higher',
  );
  expect(existsSync(held)).toBe(true);
});

test('a bad APT_LOCK_TIMEOUT_S stops before any apt-get, naming the setting', () => {
  const r = install({ APT_LOCK_TIMEOUT_S: 'ten' });
  expect(r.status).toBe(2);
  expect(r.stderr).toContain("APT_LOCK_TIMEOUT_S must be a whole number of seconds, got 'ten'");
  expect(existsSync(calls)).toBe(false);
});
