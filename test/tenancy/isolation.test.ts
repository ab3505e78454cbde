// Tenant isolation (issue 36: "No tenant can slow, freeze or fool another"). Two tenants on one
// proxy and one Postgres: A ("orders-writer", orders/) runs a seeded mix of hostile actions through
// every door it has (its SQL endpoint session, POST /v1/transactions, HTTP object and fence
// writes, a direct login in its pgRole): lock-queue DDL on every object of the `fencepost…`
// schemas and on B's protected table, long transactions at its own token, error storms, session,
// slot and connection exhaustion, huge arguments, fence-row floods (tools/tenancy/attacks.ts).
// Meanwhile B ("billing-writer", billing/)'s leader writes on all three doors and raises.
//
// Invariant, per case: B's p99 write latency and p99 raise latency are within
// max(3 × its solo p99, solo p99 + 500 ms) (tools/tenancy/run.ts BOUND, with the reason for the
// numbers: load passes, a lock wait of a second or more fails; the solo p99 is the slower of the
// first solo run and one just before the case), B sees no error (its workload has none of its
// own), and B's rows, objects and fence are exactly what B wrote. A case that misses only the
// latency bound runs once more and is judged by that run: a freeze comes back with its attack, a
// stall of a busy box does not (a loaded run saw one write of twelve at 702 ms against 646).
//
// The lock-queue targets are read from the catalog: every relation and function of the
// `fencepost…` schemas. Client roles have no USAGE on `fencepost` (migration 0019), so each of
// them must be refused at the name. Attacks on a schema A's roles may use other than its own would
// be docs/security.md's open limit ("Queue a lock on a shared table"); none is left in this setup.
// `npm run chaos -- --tenancy <s>` runs every attack alone.
// FENCEPOST_TENANCY_SEED replays a run.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { startSqlProxy, type SqlProxy } from '../support/sql.ts';
import { createTenantRoles, createTenantTables, dropTenantRoles, tenantNames, type Tenants } from '../../tools/tenancy/tenants.ts';
import { runTenancy } from '../../tools/tenancy/run.ts';

const SEED = Number(process.env.FENCEPOST_TENANCY_SEED ?? Math.floor(Math.random() * 2 ** 31));
const CASES = Number(process.env.FENCEPOST_TENANCY_CASES ?? 3);

let db: TestDatabase;
let sql: SqlProxy;
const t: Tenants = tenantNames();

beforeAll(async () => {
  db = await createTestDatabase();
  await createTenantRoles(db.pool, t);
  sql = await startSqlProxy(db, { FENCEPOST_KEYS: t.keysJson, FENCEPOST_READ_ACCESS: 'key' });
  await createTenantTables(db.pool, t);
});

afterAll(async () => {
  await sql?.close();
  if (db) await dropTenantRoles(db.pool, t);
  await db?.drop();
});

test(`tenant A's hostile mix leaves tenant B within its bound: no error, data intact (seed ${SEED})`, { timeout: 90_000 }, async () => {
  const lines: string[] = [];
  const report = await runTenancy({
    seed: SEED,
    e: { http: sql.proxy.url, pgwirePort: sql.port, database: sql.database, adminUrl: db.url },
    t,
    windowMs: 2500,
    cases: CASES,
    attacksPerCase: 3,
    print: (l) => lines.push(l),
  });
  const failed = report.cases.filter((c) => c.violations.length > 0);
  expect(report.cases.length, lines.join('\n')).toBe(CASES);
  expect(
    failed.map((c) => ({ attacks: c.attacks, violations: c.violations })),
    `replay with FENCEPOST_TENANCY_SEED=${SEED}\n${lines.join('\n')}`,
  ).toEqual([]);
});
