// Running the `fencepost` command as users do (bin/fencepost.js over dist/), and what its failures look like.
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { expect } from 'vitest';
import { BIN } from './proxy.ts';

/** Runs `fencepost …args` to the end; DATABASE_URL and the like come only from `env`. */
export function run(args: string[], env: Record<string, string> = {}, timeout = 60_000): SpawnSyncReturns<string> {
  const base = { ...process.env };
  for (const name of ['DATABASE_URL', 'PORT', 'HOST', 'ZK_CONNECT', 'ZK_AUTH', 'FENCEPOST_FORGERY_GUARD', 'FENCEPOST_DATA_DIR'])
    delete base[name];
  return spawnSync(process.execPath, [BIN, ...args], { env: { ...base, FENCEPOST_LOG_LEVEL: 'warn', ...env }, encoding: 'utf8', timeout });
}

/** Exit 1 and one line that is not a JSON log line: `fencepost: …`, with no stack trace. */
export function oneLineFailure(r: SpawnSyncReturns<string>): string {
  expect(r.status, r.stderr).toBe(1);
  const lines = r.stderr.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{'));
  expect(lines, r.stderr).toHaveLength(1);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  return lines[0]!;
}
