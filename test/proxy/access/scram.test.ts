// SCRAM-SHA-256 of the SQL endpoint, against the real endpoint and real clients: SASLprep of key
// secrets (libpq prepares the password it sends, as Postgres expects), the salt an unknown user is
// answered with, the iteration count the proxy accepts from its backend, and key derivation that
// leaves the event loop free.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { connect as tcp } from 'node:net';
import { promisify } from 'node:util';
import pg from 'pg';
import { clientRoleFor, createTestDatabase, type TestDatabase } from '../../support/db.ts';
import { adminQuery, uniqueRole } from '../../support/keys.ts';
import { startSqlProxy, type SqlProxy } from '../../support/sql.ts';
import { MAX_ITERATIONS, ScramClient, saltedPassword } from '../../../src/proxy/access/scram.ts';
import { saslprep, saslprepOrRaw } from '../../../src/proxy/access/saslprep.ts';
import { loginName, scramVerifier } from '../../../src/fence/client-logins.ts';
import { message } from '../../../src/proxy/sql/wire/framing.ts';
import { PROTOCOL_3_0 } from '../../../src/proxy/sql/wire/frontend.ts';

const run = promisify(execFile);
const PYTHON = '/usr/bin/python3';
const PSQL = '/usr/bin/psql';

// 'ﬁ' (U+FB01) is "fi" under NFKC; the soft hyphen U+00AD is mapped to nothing.
const PREP_SECRET = 'prep-\uFB01le-secret\u00AD-0123456789';
const PREP_EQUIVALENT = 'prep-file-secret-0123456789';
// U+E000 is private use: SASLprep refuses it, and both ends fall back to the raw password.
const RAW_SECRET = 'raw-\uE000-secret-0123456789';
const PLAIN_SECRET = 'plain-secret-0123456789';

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );

let db: TestDatabase;
let sql: SqlProxy;
const role = uniqueRole('scram');
beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(`CREATE ROLE ${role} NOLOGIN`);
  const keys = [
    { name: 'prep', secret: PREP_SECRET, fenceKeyPrefixes: ['p/'], pgRole: role },
    { name: 'raw', secret: RAW_SECRET, fenceKeyPrefixes: ['r/'], pgRole: role },
    { name: 'plain', secret: PLAIN_SECRET, fenceKeyPrefixes: ['q/'], pgRole: role },
  ];
  sql = await startSqlProxy(db, { FENCEPOST_KEYS: JSON.stringify(keys), FENCEPOST_READ_ACCESS: 'key' });
});
afterAll(async () => {
  await sql?.close();
  await db?.drop(); // drops the client logins the role was granted to
  await adminQuery(`DROP ROLE IF EXISTS ${role}`);
});

/** psycopg2 (libpq, which SASLpreps the password) logs in and reads current_user. */
async function psycopg2Login(user: string, password: string): Promise<string> {
  const program = `import sys, psycopg2
try:
    conn = psycopg2.connect(sys.argv[1], password=sys.argv[2])
    cur = conn.cursor()
    cur.execute('SELECT current_user')
    print(cur.fetchone()[0])
except psycopg2.OperationalError as e:
    print('refused: ' + str(e).strip().splitlines()[0])`;
  return (await run(PYTHON, ['-c', program, sql.url(user), password])).stdout.trim();
}

describe('SASLprep', () => {
  test("RFC 4013's examples: soft hyphen removed, NFKC, prohibited and bidi-violating strings refused", () => {
    expect(['I\u00ADX', 'user', 'USER', '\u00AA', '\u2168', 'a\u00A0b'].map((s) => saslprep(s))).toEqual([
      'IX',
      'user',
      'USER',
      'a',
      'IX',
      'a b',
    ]);
    expect(() => saslprep('\u0007')).toThrow(/prohibited/);
    expect(() => saslprep('\u0627\u0031')).toThrow(/right-to-left/);
    expect(saslprepOrRaw(RAW_SECRET)).toBe(RAW_SECRET);
  });

  // The key's SCRAM keys come from its SASLprepped secret, as Postgres keeps a password's.
  test('psycopg2 logs in with the secret as configured and with its SASLprep equivalent; psql too; a different one fails', async () => {
    expect(await psycopg2Login('prep', PREP_SECRET)).toBe(role);
    expect(await psycopg2Login('prep', PREP_EQUIVALENT)).toBe(role);
    const viaPsql = await run(PSQL, [sql.url('prep'), '-X', '-At', '-c', 'SELECT current_user'], {
      env: { ...process.env, PGPASSWORD: PREP_EQUIVALENT, PGOPTIONS: '' },
    });
    expect(viaPsql.stdout.trim()).toBe(role);
    expect(await psycopg2Login('prep', 'prep-file-secret-0123456780')).toMatch(/^refused: .*password authentication failed/);
  });

  test('node-postgres (no SASLprep of its own) logs in with the prepared form', async () => {
    const c = await sql.connect('prep', { password: PREP_EQUIVALENT });
    expect((await c.query('SELECT current_user AS u')).rows[0].u).toBe(role);
    await c.end();
  });

  test('a secret SASLprep refuses is used as it is, on both ends (as Postgres and libpq do)', async () => {
    expect(await psycopg2Login('raw', RAW_SECRET)).toBe(role);
  });
});

/** The server-first message a user is answered with (a raw client, up to the SASL challenge). */
function serverFirst(user: string): Promise<{ salt: Buffer; iterations: number }> {
  return new Promise((resolve, reject) => {
    const sock = tcp({ host: '127.0.0.1', port: sql.port });
    let buf = Buffer.alloc(0);
    sock.on('error', reject);
    sock.on('connect', () => sock.write(message('', PROTOCOL_3_0, 'user', user, 'database', sql.database, Buffer.from([0]))));
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 5 && buf.length >= 1 + buf.readInt32BE(1)) {
        const type = String.fromCharCode(buf[0]!);
        const body = buf.subarray(5, 1 + buf.readInt32BE(1));
        buf = buf.subarray(1 + buf.readInt32BE(1));
        if (type !== 'R') return reject(new Error(`unexpected ${type}`));
        const kind = body.readInt32BE(0);
        if (kind === 10) {
          const first = Buffer.from(`n,,n=*,r=${randomBytes(12).toString('base64')}`);
          sock.write(message('p', 'SCRAM-SHA-256', first.length, first));
        } else if (kind === 11) {
          const attrs = new Map(
            body
              .subarray(4)
              .toString('utf8')
              .split(',')
              .map((p) => [p[0]!, p.slice(2)] as const),
          );
          sock.destroy();
          resolve({ salt: Buffer.from(attrs.get('s')!, 'base64'), iterations: Number(attrs.get('i')) });
        }
      }
    });
  });
}

describe('an unknown user', () => {
  // Comparing salts must not tell key names from other names: a name's salt is the same at every
  // attempt whether or not it is a key, and looks like a key's.
  test("is answered with a salt that is stable across attempts and shaped like a key's, with the same iteration count", async () => {
    const [a1, a2, b, key1, key2] = await Promise.all([
      serverFirst('nobody'),
      serverFirst('nobody'),
      serverFirst('somebody-else'),
      serverFirst('plain'),
      serverFirst('plain'),
    ]);
    expect(a1.salt.equals(a2.salt)).toBe(true);
    expect(key1.salt.equals(key2.salt)).toBe(true);
    expect(a1.salt.equals(b.salt)).toBe(false);
    expect([a1.salt.length, a1.iterations]).toEqual([key1.salt.length, key1.iterations]);
  });
});

describe('key derivation', () => {
  // Salted passwords are derived in the thread pool: a callback queued after the derivations
  // started runs before any of them is done.
  test('runs off the event loop: an immediate queued after eight derivations at the cap runs before the first finishes', async () => {
    const order: string[] = [];
    const derivations = Array.from({ length: 8 }, () =>
      saltedPassword('event-loop-secret', randomBytes(16), MAX_ITERATIONS).then(() => order.push('derived')),
    );
    const immediate = new Promise<void>((resolve) => setImmediate(() => resolve(void order.push('immediate'))));
    await Promise.all([...derivations, immediate]);
    expect(order[0]).toBe('immediate');
  });

  test('a server asking more iterations than the cap is refused at once, nothing derived', async () => {
    const client = new ScramClient('whatever');
    const nonce = /r=([^,]+)/.exec(client.first())![1]!;
    await expect(client.final(`r=${nonce}srv,s=${randomBytes(16).toString('base64')},i=1000000000`)).rejects.toThrow(/iterations/);
  });

  describe('of the backend login', () => {
    const login = () => loginName(clientRoleFor(db.url), 'plain');
    const setIterations = async (iterations: number) => {
      const { rows } = await db.pool.query<{ password: string }>('SELECT password FROM fencepost.client_logins WHERE login = $1', [
        login(),
      ]);
      await db.pool.query(
        `ALTER ROLE ${pg.escapeIdentifier(login())} PASSWORD ${pg.escapeLiteral(scramVerifier(rows[0]!.password, iterations))}`,
      );
    };
    afterAll(async () => {
      await setIterations(4096);
    });

    test("twenty concurrent SCRAM logins complete while the backend asks for the cap's iterations, and a timer set meanwhile fires", async () => {
      await setIterations(MAX_ITERATIONS);
      let fired = false;
      const timer = new Promise<void>((resolve) => setTimeout(() => resolve(void (fired = true)), 1));
      const results = await Promise.all(
        Array.from({ length: 20 }, async () => {
          const c = await sql.connect('plain', { password: PLAIN_SECRET });
          const u = (await c.query('SELECT current_user AS u')).rows[0].u as string;
          await c.end();
          return u;
        }),
      );
      await timer;
      expect([results, fired]).toEqual([Array(20).fill(role), true]);
    });

    test('a backend asking more iterations than the cap is refused with the reason', async () => {
      await setIterations(MAX_ITERATIONS + 1);
      const err = await sql.connect('plain', { password: PLAIN_SECRET }).catch((e: Error & { code?: string }) => e);
      expect(err).toMatchObject({ code: '28000', message: expect.stringContaining('iterations') });
    });
  });
});

test('a wrong password still fails with 28P01 (the exchange is unchanged for ASCII secrets)', async () => {
  expect(await code(sql.connect('plain', { password: 'plain-secret-0123456780' }))).toBe('28P01');
});
