// Provisioning of the client logins: created when DATABASE_URL's role may, otherwise the exact SQL
// to run is reported and transactions are refused until it has run; unsafe roles are refused.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import pg from 'pg';
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { migrate } from '../../src/fence/migrate.ts';
import { provisionClientLogins } from '../../src/fence/client-logins.ts';
import { PROVISIONING_LOCK_KEY } from '../../src/fence/sql/logins.ts';
import type { TxResult } from '../../src/fence/transaction.ts';
import { Fence } from '../../src/fence/fence.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { withDatabase, createTestDatabase, clientRoleFor, type TestDatabase } from '../support/db.ts';
import { adminQuery, uniqueRole } from '../support/keys.ts';
import { startSqlProxy } from '../support/sql.ts';

const hex = randomBytes(4).toString('hex');
const ownerRole = `fp_own_${hex}`;
const dbName = `fp_test_own_${hex}`;
const clientRole = `fpc_own_${hex}`;
let ownerPool: pg.Pool;
let adminOnDb: pg.Pool;

beforeAll(async () => {
  await adminQuery(`CREATE ROLE ${ownerRole} LOGIN PASSWORD 'owner-pw'`);
  await adminQuery(`CREATE DATABASE ${dbName} OWNER ${ownerRole}`);
  const url = new URL(withDatabase(inject('databaseUrl'), dbName));
  adminOnDb = new pg.Pool({ connectionString: url.toString(), max: 2 });
  // pool.end() resolves before its connections have closed: the DROP … WITH (FORCE) after it may
  // terminate one still closing, which must not become an uncaught error of the run.
  adminOnDb.on('error', () => {});
  url.username = ownerRole;
  url.password = 'owner-pw';
  ownerPool = new pg.Pool({ connectionString: url.toString(), max: 4 });
  ownerPool.on('error', () => {});
  await migrate(ownerPool);
});

afterAll(async () => {
  await ownerPool?.end();
  await adminOnDb?.end();
  await adminQuery(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  await adminQuery(`DROP ROLE IF EXISTS ${clientRole}`);
  await adminQuery(`DROP ROLE IF EXISTS ${ownerRole}`);
});

/** A fence whose /v1/transactions run as the client login of open mode. */
function runner(): Fence {
  return new Fence({
    store: new FenceStore(ownerPool, STORE_DEFAULTS),
    clientRole,
    logins: [{ keyName: null, pgRole: null }],
    lockTimeoutMs: 500,
    raiseWaitMs: 1000,
    provisionRetryMs: 0,
    transactions: {
      database: (ownerPool as unknown as { options: { connectionString: string } }).options.connectionString,
      maxConcurrent: 2,
      statementTimeoutMs: 2000,
      lockTimeoutMs: 500,
      maxConcurrentPerKey: 4,
      transactionTimeoutMs: 5000,
      maxResultBytes: 65536,
      retries: 0,
    },
  });
}

describe('a DATABASE_URL role that may not create roles', () => {
  test('transactions are refused with the SQL that fixes it; once an operator runs it, they run as the client login', async () => {
    const r = runner();
    try {
      const refused = await r
        .transact(null, [{ fenceKey: 'k', token: 1n }], [{ sql: 'SELECT 1', params: [] }], { isolation: 'read committed', writerId: null })
        .catch((e: Error) => e);
      expect((refused as Error).name).toBe('LoginUnavailableError');
      const { problems } = await r.provision();
      const sql = problems.get(null)!.sql;
      expect(sql[0]).toMatch(new RegExp(`^CREATE ROLE "${clientRole}" LOGIN .*NOSUPERUSER.* PASSWORD 'SCRAM-SHA-256\\$4096:`));
      expect((await ownerPool.query(`SELECT 1 FROM fencepost.fences WHERE fence_key = 'k'`)).rowCount).toBe(0);
      for (const stmt of sql) await adminOnDb.query(stmt); // the operator, as a superuser
      const ok = (await r.transact(null, [{ fenceKey: 'k', token: 1n }], [{ sql: 'SELECT current_user::text AS u', params: [] }], {
        isolation: 'read committed',
        writerId: null,
      })) as Extract<TxResult, { committed: true }>;
      expect(ok.committed).toBe(true);
      expect(ok.results[0]!.rows[0]).toEqual({ u: clientRole });
    } finally {
      await r.close();
    }
  });
});

describe('roles that would escape are refused', () => {
  let db: TestDatabase;
  const bad = uniqueRole('bad');
  const foreign = uniqueRole('foreign');
  const extra = uniqueRole('extra');
  const good = uniqueRole('good');
  beforeAll(async () => {
    db = await createTestDatabase();
    const admin = (await db.pool.query<{ u: string }>('SELECT current_user AS u')).rows[0]!.u;
    await adminQuery(
      `CREATE ROLE ${bad} NOLOGIN; GRANT "${admin}" TO ${bad}; CREATE ROLE ${foreign} LOGIN; CREATE ROLE ${extra} NOLOGIN; CREATE ROLE ${good} NOLOGIN`,
    );
  });
  afterAll(async () => {
    await db.drop();
    await adminQuery(
      `DROP ROLE IF EXISTS ${bad}; DROP ROLE IF EXISTS ${foreign}; DROP ROLE IF EXISTS ${extra}; DROP ROLE IF EXISTS ${good}`,
    );
  });

  test('a pgRole that reaches a superuser (here: the owner of the fencepost schema) gets no login', async () => {
    const { logins, problems } = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 'k', pgRole: bad }]);
    expect(logins.size).toBe(0);
    expect(problems.get('k')!.message).toMatch(/reaches/);
  });

  test('a pgRole that can create subscriptions (pg_create_subscription: their apply worker writes past triggers) gets no login', async () => {
    const subscriber = uniqueRole('subscriber');
    const { rows } = await db.pool.query(`SELECT 1 FROM pg_roles WHERE rolname = 'pg_create_subscription'`);
    if (rows.length === 0) return; // Postgres before 16 has no such role
    await adminQuery(`CREATE ROLE ${subscriber} NOLOGIN; GRANT pg_create_subscription TO ${subscriber}`);
    try {
      const s = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 's', pgRole: subscriber }]);
      expect(s.logins.size).toBe(0);
      expect(s.problems.get('s')!.message).toMatch(/pg_create_subscription/);
    } finally {
      await adminQuery(`DROP ROLE IF EXISTS ${subscriber}`);
    }
  });

  test('a pgRole that can read or write every table (pg_read_all_data) or holds a privilege on a fencepost table gets no login', async () => {
    const allData = uniqueRole('alldata');
    const direct = uniqueRole('direct');
    await adminQuery(`CREATE ROLE ${allData} NOLOGIN; GRANT pg_read_all_data TO ${allData}; CREATE ROLE ${direct} NOLOGIN`);
    await db.pool.query(`GRANT SELECT ON fencepost.fence_capability TO ${direct}`);
    try {
      const a = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 'a', pgRole: allData }]);
      expect(a.problems.get('a')!.message).toMatch(/pg_read_all_data/);
      const d = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 'd', pgRole: direct }]);
      expect(d.problems.get('d')!.message).toMatch(/a privilege on fencepost\.fence_capability/);
    } finally {
      await db.pool.query(`REVOKE ALL ON fencepost.fence_capability FROM ${direct}`);
      await adminQuery(`DROP ROLE IF EXISTS ${allData}; DROP ROLE IF EXISTS ${direct}`);
    }
  });

  test("a pgRole with USAGE on schema fencepost (it could queue DDL locks on the fence's tables) gets no login; the logins and roles provisioned have none", async () => {
    const naming = uniqueRole('naming');
    await adminQuery(`CREATE ROLE ${naming} NOLOGIN`);
    await db.pool.query(`GRANT USAGE ON SCHEMA fencepost TO ${naming}`);
    try {
      const n = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 'n', pgRole: naming }]);
      expect(n.logins.size).toBe(0);
      expect(n.problems.get('n')!.message).toMatch(/USAGE on schema fencepost/);
      const g = await provisionClientLogins(db.pool, clientRoleFor(db.pool), [{ keyName: 'g', pgRole: good }]);
      const login = g.logins.get('g')!.login;
      const { rows } = await db.pool.query(
        `SELECT r.rolname, has_schema_privilege(r.oid, 'fencepost', 'USAGE') AS fence, has_schema_privilege(r.oid, 'fencepost_api', 'USAGE') AS api
         FROM pg_roles r WHERE r.rolname = ANY($1) ORDER BY r.rolname`,
        [[login, good]],
      );
      expect(rows).toEqual([login, good].sort().map((rolname) => ({ rolname, fence: false, api: true })));
    } finally {
      await db.pool.query(`REVOKE ALL ON SCHEMA fencepost FROM ${naming}`);
      await adminQuery(`DROP ROLE IF EXISTS ${naming}`);
    }
  });

  test("a role of the login's name made elsewhere (roles are cluster-wide) is not adopted", async () => {
    const { logins, problems } = await provisionClientLogins(db.pool, foreign, [{ keyName: null, pgRole: null }]);
    expect(logins.size).toBe(0);
    expect(problems.get(null)!.message).toMatch(/not created for this database/);
  });

  test("a login granted another role since is brought back to its key's role only", async () => {
    const role = clientRoleFor(db.pool);
    const first = await provisionClientLogins(db.pool, role, [{ keyName: 'g', pgRole: good }]);
    const login = first.logins.get('g')!.login;
    await adminQuery(`GRANT ${extra} TO "${login}"`);
    const again = await provisionClientLogins(db.pool, role, [{ keyName: 'g', pgRole: good }]);
    expect(again.problems.size).toBe(0);
    expect(again.logins.get('g')!.password).toBe(first.logins.get('g')!.password);
    const { rows } = await db.pool.query(
      `SELECT r.rolname::text AS r FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles l ON l.oid = m.member WHERE l.rolname = $1`,
      [login],
    );
    expect(rows).toEqual([{ r: good }]);
  });

  test('two proxies provisioning at once agree on one password and both can connect', async () => {
    const role = clientRoleFor(db.pool);
    const [a, b] = await Promise.all([
      provisionClientLogins(db.pool, role, [{ keyName: 'twice', pgRole: good }]),
      provisionClientLogins(db.pool, role, [{ keyName: 'twice', pgRole: good }]),
    ]);
    expect(a.problems.size + b.problems.size).toBe(0);
    expect(a.logins.get('twice')!.password).toBe(b.logins.get('twice')!.password);
  });

  test("a proxy starting while another provisions waits for its turn past the pool's lock_timeout", async () => {
    // Like the proxy's pool (FENCEPOST_LOCK_TIMEOUT_MS), set on the connection.
    const owner = new pg.Pool({ connectionString: db.url, max: 2, options: '-c lock_timeout=100' });
    const other = await db.pool.connect();
    try {
      // The other instance, slow: it holds the provisioning lock for longer than lock_timeout.
      await other.query('BEGIN');
      await other.query('SELECT pg_advisory_xact_lock($1)', [PROVISIONING_LOCK_KEY.toString()]);
      const started = Date.now();
      const provisioning = provisionClientLogins(owner, clientRoleFor(db.pool), [{ keyName: 'turn', pgRole: good }]);
      await new Promise((r) => setTimeout(r, 500));
      await other.query('COMMIT');
      const { logins, problems } = await provisioning;
      expect(problems.size).toBe(0);
      expect(logins.has('turn')).toBe(true);
      expect(Date.now() - started).toBeGreaterThanOrEqual(500);
    } finally {
      other.release();
      await owner.end();
    }
  });
});

describe('role-level settings of a client login', () => {
  // Invariant: whatever was set on a client login's role (ALTER ROLE … SET, also IN DATABASE; a
  // login may set its own, e.g. synchronous_commit = off), a proxy start removes: no
  // pg_db_role_setting row is left for the login.
  let db: TestDatabase;
  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterAll(async () => {
    await db?.drop();
  });
  const settingsOf = async (role: string) =>
    (
      await db.pool.query<{ setconfig: string[] }>(
        'SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = $1',
        [role],
      )
    ).rows;

  test('a proxy start resets synchronous_commit = off set on the login, for every database and for this one', async () => {
    const login = clientRoleFor(db.url);
    await (await startSqlProxy(db)).close(); // the first start creates the login
    await adminQuery(`ALTER ROLE ${login} SET synchronous_commit = off`);
    await db.pool.query(`ALTER ROLE ${login} IN DATABASE ${new URL(db.url).pathname.slice(1)} SET synchronous_commit = off`);
    expect(await settingsOf(login)).toEqual([{ setconfig: ['synchronous_commit=off'] }, { setconfig: ['synchronous_commit=off'] }]);
    await (await startSqlProxy(db)).close();
    expect(await settingsOf(login)).toEqual([]);
  });
});
