// asyncpg through the SQL endpoint, as its users write: its message orders differ from libpq's
// (prepare() sends Parse/Describe/Flush and no Sync, then a Query for transaction() or an
// argument-less execute(); copy_records_to_table prepares its COPY the same way). Invariant: what
// a fenced session commits lands, in order; once a newer leader raised the fence, nothing of the
// old session lands and it hears FP409 (its prepare() too: a stale session's every message group
// is refused).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';

const run = promisify(execFile);
const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.apg (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);

const PROGRAM = `import asyncio, sys, asyncpg
url, key, token, base = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
async def main():
    out = []
    c = await asyncpg.connect(url, server_settings={'fencepost.token': token, 'fencepost.fence_key': key})
    async def step(name, coro):
        try:
            await coro
            out.append(name + ':ok')
        except asyncpg.PostgresError as e:
            out.append(name + ':' + e.sqlstate)
    st = None
    async def prepare():
        nonlocal st
        st = await c.prepare('INSERT INTO public.apg VALUES ($1, $2)')
    await step('prepare', prepare())
    async def in_transaction():
        async with c.transaction():
            await (st.fetch(base + 1, 'prepared in transaction') if st else c.execute('INSERT INTO public.apg VALUES ($1, $2)', base + 1, 'in transaction'))
    await step('transaction', in_transaction())
    await step('execute', c.execute("INSERT INTO public.apg VALUES (%d, 'argument-less execute')" % (base + 2)))
    await step('copy', c.copy_records_to_table('apg', schema_name='public', records=[(base + 3, 'copy'), (base + 4, 'copy')]))
    await step('select', c.fetchval('SELECT count(*) FROM public.apg WHERE id > $1', base))
    print(' '.join(out))
    await c.close()
asyncio.run(main())`;

const asyncpg = async (url: string, key: string, token: number, base: number) =>
  (await run('/usr/bin/python3', ['-c', PROGRAM, url, key, String(token), String(base)])).stdout.trim();
const ids = async (db: { pool: { query: (q: string, v: unknown[]) => Promise<{ rows: { id: number }[] }> } }, base: number) =>
  (await db.pool.query('SELECT id FROM public.apg WHERE id > $1 AND id < $2 ORDER BY id', [base, base + 100])).rows.map((r) => r.id);

describe('asyncpg', () => {
  test('prepare() then transaction(), an argument-less execute(), copy_records_to_table: all commit through the endpoint', async ({
    db,
    sql,
  }) => {
    expect(await asyncpg(sql.url('asyncpg-leader'), 'asyncpg/a', 1, 100)).toBe('prepare:ok transaction:ok execute:ok copy:ok select:ok');
    expect(await ids(db, 100)).toEqual([101, 102, 103, 104]);
  });

  test('a stale session: every step fails FP409 and nothing lands', async ({ db, sql }) => {
    const raised = await fetch(`${sql.proxy.url}/v1/fences/asyncpg%2Fb`, { method: 'PUT', headers: { 'fencing-token': '2' } });
    expect(raised.status).toBe(200);
    expect(await asyncpg(sql.url('asyncpg-zombie'), 'asyncpg/b', 1, 200)).toBe(
      'prepare:FP409 transaction:FP409 execute:FP409 copy:FP409 select:FP409',
    );
    expect(await ids(db, 200)).toEqual([]);
  });
});
