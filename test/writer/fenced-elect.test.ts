// `fencepost elect --proxy --fence-key` against a real proxy: the fence advance before each term.
import { afterAll, beforeAll, expect, inject, test } from 'vitest';
import { spawn } from 'node:child_process';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { BIN, listen, testApp } from '../support/proxy.ts';
import { uniquePath } from '../support/election.ts';

let db: TestDatabase;
let app: FastifyInstance;
let url: string;

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  url = await listen(app);
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

function elect(fenceKey: string, command: string[]): Promise<{ code: number | null; stderr: string; stdout: string }> {
  const child = spawn(
    process.execPath,
    [
      BIN,
      'elect',
      '--zk',
      inject('zkConnect'),
      '--path',
      uniquePath('fenced-elect'),
      '--id',
      'r1',
      '--session-timeout-ms',
      '2000',
      '--proxy',
      url,
      '--fence-key',
      fenceKey,
      '--',
      ...command,
    ],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
  return new Promise((resolve) => child.once('exit', (code) => (clearTimeout(timer), resolve({ code, stderr, stdout }))));
}

test('the command starts only after the fence is advanced to its token, and gets FENCEPOST_URL and FENCE_KEY', async () => {
  const fenceKey = `fe-${Date.now()}`;
  const script = `const r = await fetch(process.env.FENCEPOST_URL + '/v1/fences/' + process.env.FENCE_KEY); const f = await r.json();
    console.log(JSON.stringify({ token: process.env.FENCING_TOKEN, key: process.env.FENCE_KEY, highest: f.highestToken }));`;
  const r = await elect(fenceKey, [process.execPath, '--input-type=module', '-e', script]);
  expect(r.code, r.stderr).toBe(0);
  const seen = JSON.parse(r.stdout.trim()) as { token: string; key: string; highest: string };
  expect(seen.key).toBe(fenceKey);
  expect(seen.highest).toBe(seen.token); // the fence stood at this term's token before the command ran
});

test('a fence advance the proxy refuses with a 4xx other than 409 stops elect with exit 1, without running the command', async () => {
  const r = await elect('x'.repeat(1025), [process.execPath, '-e', 'console.log("ran")']);
  expect(r.code).toBe(1);
  expect(r.stdout).not.toContain('ran');
  expect(r.stderr).toContain('invalid_key');
});
