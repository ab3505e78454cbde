// asyncpg through the SQL endpoint, as its users write: its message orders differ from libpq's
// (prepare() sends Parse/Describe/Flush and no Sync, then a Query for transaction() or an
// argument-less execute(); copy_records_to_table prepares its COPY the same way). Invariant: what
// a fenced connection commits lands, in order; a stale token is refused at connect (FP409); a
// newer leader's raise ends a fenced connection: its next step hears FP409, and nothing it sends
// after the raise lands.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect } from 'vitest';
import { sqlTest } from '../../support/fixtures.ts';

const run = promisify(execFile);
const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.apg (id int PRIMARY KEY, v text)', privileges: 'SELECT, INSERT' },
]);

const PROGRAM = `import asyncio, sys, asyncpg
import urllib.request
url, key, token, base = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# argv[5], if given: a fence URL raised to token + 1 (a newer leader) right after prepare().
raise_url = sys.argv[5] if len(sys.argv) > 5 else None
async def main():
    out = []
    try:
        c = await asyncpg.connect(url, server_settings={'fencepost.token': token, 'fencepost.fence_key': key})
    except asyncpg.PostgresError as e:
        print('connect:' + e.sqlstate)
        return
    async def step(name, coro):
        try:
            await coro
            out.append(name + ':ok')
        except asyncpg.PostgresError as e:
            out.append(name + ':' + e.sqlstate)
        except (asyncpg.InterfaceError, ConnectionError) as e:
            out.append(name + ':' + type(e).__name__)
    st = None
    async def prepare():
        nonlocal st
        st = await c.prepare('INSERT INTO public.apg VALUES ($1, $2)')
    await step('prepare', prepare())
    if raise_url:
        urllib.request.urlopen(urllib.request.Request(raise_url, method='PUT', headers={'Fencing-Token': str(int(token) + 1)}))
    async def in_transaction():
        async with c.transaction():
            await (st.fetch(base + 1, 'prepared in transaction') if st else c.execute('INSERT INTO public.apg VALUES ($1, $2)', base + 1, 'in transaction'))
    await step('transaction', in_transaction())
    await step('execute', c.execute("INSERT INTO public.apg VALUES (%d, 'argument-less execute')" % (base + 2)))
    await step('copy', c.copy_records_to_table('apg', schema_name='public', records=[(base + 3, 'copy'), (base + 4, 'copy')]))
    await step('select', c.fetchval('SELECT count(*) FROM public.apg WHERE id > $1', base))
    print(' '.join(out))
    c.terminate()
asyncio.run(main())`;

const asyncpg = async (url: string, key: string, token: number, base: number, raiseUrl?: string) =>
  (
    await run('/usr/bin/python3', ['-c', PROGRAM, url, key, String(token), String(base), ...(raiseUrl === undefined ? [] : [raiseUrl])])
  ).stdout.trim();
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

  test('a stale token: connect() fails with FP409 and nothing lands', async ({ db, sql }) => {
    const raised = await fetch(`${sql.proxy.url}/v1/fences/asyncpg%2Fb`, { method: 'PUT', headers: { 'fencing-token': '2' } });
    expect(raised.status).toBe(200);
    expect(await asyncpg(sql.url('asyncpg-zombie'), 'asyncpg/b', 1, 200)).toBe('connect:FP409');
    expect(await ids(db, 200)).toEqual([]);
  });

  test("a newer leader's raise after prepare(): the next step hears FP409, no later step runs, nothing lands", async ({ db, sql }) => {
    const out = await asyncpg(sql.url('asyncpg-deposed'), 'asyncpg/c', 1, 300, `${sql.proxy.url}/v1/fences/asyncpg%2Fc`);
    const [prepare, transaction, ...rest] = out.split(' ');
    expect([prepare, transaction]).toEqual(['prepare:ok', 'transaction:FP409']);
    expect(rest.map((r) => r.split(':')[0])).toEqual(['execute', 'copy', 'select']);
    expect(rest.filter((r) => r.endsWith(':ok'))).toEqual([]);
    expect(await ids(db, 300)).toEqual([]);
  });
});
