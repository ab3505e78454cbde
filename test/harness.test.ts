import { inject, test, expect } from 'vitest';
import pg from 'pg';
import { fourLetterWord } from '../tools/zookeeper/local-server.ts';

test('the harness provides a real Postgres and a real ZooKeeper', async () => {
  const client = new pg.Client({ connectionString: inject('databaseUrl') });
  await client.connect();
  const { rows } = await client.query<{ one: number }>('select 1 as one');
  await client.end();
  expect(rows[0]?.one).toBe(1);
  const port = Number(inject('zkConnect').split(',')[0]!.split(':')[1]);
  expect(await fourLetterWord(port, 'ruok')).toBe('imok');
});
