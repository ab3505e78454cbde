// The lesson's worked example 2 with a transaction, with real processes: three replicas under
// `fencepost elect --proxy --fence-key`, each a psycopg2 writer looping BEGIN; INSERT; COMMIT
// through the SQL endpoint (tools/demo/elected-transaction.ts). The leader (elect and its writer)
// is frozen between INSERT and COMMIT past the session timeout. Invariants: a new leader with a
// higher token is elected and its first transaction commits; the zombie's COMMIT after SIGCONT
// fails; nothing of the zombie's transaction is in the table. No timing is asserted.
//
// Known gap: psycopg2 (libpq) does not hear the FP409 the proxy answers the zombie's COMMIT with; it
// reports "server closed the connection unexpectedly" with no SQLSTATE (node-postgres hears FP409:
// test/fence/handover.test.ts, test/writer/demo-transaction.test.ts). The second test states what it
// should be and is marked as failing until the SQL endpoint is fixed (src/proxy/sql/relay.ts
// answerNextWith, others' area).
import { expect, inject } from 'vitest';
import { sqlTest } from '../support/fixtures.ts';
import { uniquePath } from '../support/election.ts';
import { runElectedTransaction } from '../../tools/demo/elected-transaction.ts';
import type { TestDatabase } from '../support/db.ts';
import type { SqlProxy } from '../support/sql.ts';

const test = sqlTest.extend('clientTables', { scope: 'file' }, [
  { definition: 'public.et_ledger (key text PRIMARY KEY, token bigint NOT NULL)', privileges: 'SELECT, INSERT' },
  { definition: 'public.et_ledger2 (key text PRIMARY KEY, token bigint NOT NULL)', privileges: 'SELECT, INSERT' },
]);

async function scenario(db: TestDatabase, sql: SqlProxy, table: string) {
  const path = uniquePath('elected-tx');
  return await runElectedTransaction({
    zkConnect: inject('zkConnect'),
    electionPath: path,
    proxyUrl: sql.proxy.url,
    pgwire: `127.0.0.1:${sql.port}/${sql.database}`,
    table,
    fenceKey: `et-${path.split('/').at(-1)}`,
    pool: db.pool,
    sessionTimeoutMs: 2000,
  });
}

test("a leader frozen between INSERT and COMMIT: the new leader's first transaction commits, the zombie's COMMIT fails and its row never lands", async ({
  db,
  sql,
}) => {
  const r = await scenario(db, sql, 'public.et_ledger');
  expect(r.successor.replica).not.toBe(r.zombie.replica);
  expect(BigInt(r.successor.token) > BigInt(r.zombie.token)).toBe(true);
  expect(r.firstWrite.event).toBe('committed');
  expect(r.zombieCommit).toMatchObject({ event: 'commit-failed', key: r.zombie.key });
  expect(r.zombieRowPresent).toBe(false);
  expect(r.missingCommitted).toEqual([]);
}, 90_000);

test("psycopg2 hears the zombie's COMMIT refused with FP409", async ({ db, sql }) => {
  const r = await scenario(db, sql, 'public.et_ledger2');
  expect(r.zombieCommit).toMatchObject({ event: 'commit-failed', code: 'FP409' });
}, 90_000);
