// The fence rule, one table through every door. Each case starts from a fence at token 5 with data
// written under it, then a writer key sends one write through a door; every door must give the same
// outcome, and Postgres must show the fence row and the data moved exactly when the write was
// accepted. The doors are a real proxy: HTTP objects (PUT and DELETE), POST /v1/transactions, and
// the SQL endpoint (a real listener, node-postgres), all with bearer keys.
import { expect } from 'vitest';
import pg from 'pg';
import type { TestDatabase } from '../support/db.ts';
import { bearer } from '../support/keys.ts';
import { sqlTest } from '../support/fixtures.ts';
import { fenceOptions, fenceRow, type SqlProxy } from '../support/sql.ts';

/** The writer under test may name fence keys under `rule/in/` only; `seed` may name any. */
const WRITER = { name: 'rule-writer', secret: 'rule-writer-secret-4c9e2a7f' };
const SEED = { name: 'rule-seed', secret: 'rule-seed-secret-8d1b3e6a' };
const SEEDED_TOKEN = '5';

const test = sqlTest.extend('sqlEnv', { scope: 'file' }, async ({ pgRole }) => ({
  FENCEPOST_KEYS: JSON.stringify([
    { name: WRITER.name, secret: WRITER.secret, fenceKeyPrefixes: ['rule/in/'], pgRole },
    { name: SEED.name, secret: SEED.secret, fenceKeyPrefixes: [''], pgRole },
  ]),
  FENCEPOST_READ_ACCESS: 'key',
}));

test.beforeAll(async ({ db, pgRole }) => {
  await db.pool.query('CREATE TABLE public.rule_data (id text PRIMARY KEY, v text NOT NULL)');
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE ON public.rule_data TO ${pgRole}`);
});

type Outcome = 'accepted' | 'stale' | 'invalid' | 'forbidden';

interface Target {
  fenceKey: string;
  /** The object key (object doors) or the rule_data row (transaction and SQL doors). */
  dataKey: string;
}

interface Door {
  name: string;
  /** Writes the data under the fence at SEEDED_TOKEN, with the seed key. */
  seed(sql: SqlProxy, t: Target): Promise<void>;
  /** The write under test, with the writer key, normalised to an outcome. */
  write(sql: SqlProxy, t: Target, token: string): Promise<Outcome | string>;
  /** The data as Postgres has it now (null: absent). */
  read(db: TestDatabase, t: Target): Promise<string | null>;
  /** What `read` gives after an accepted write. */
  written: string | null;
}

const HTTP_OUTCOME: Record<string, Outcome> = { stale_token: 'stale', invalid_token: 'invalid', forbidden: 'forbidden' };

async function httpOutcome(res: Response, accepted: number): Promise<Outcome | string> {
  if (res.status === accepted) return 'accepted';
  const body = (await res.json()) as { error?: string };
  return HTTP_OUTCOME[body.error ?? ''] ?? `unexpected ${res.status} ${JSON.stringify(body)}`;
}

const SQL_OUTCOME: Record<string, Outcome> = { FP409: 'stale', FP400: 'invalid', '42501': 'forbidden' };

const objectUrl = (sql: SqlProxy, key: string) => `${sql.proxy.url}/v1/objects/${encodeURIComponent(key)}`;

async function seedObject(sql: SqlProxy, t: Target): Promise<void> {
  const res = await fetch(objectUrl(sql, t.dataKey), {
    method: 'PUT',
    headers: { ...bearer(SEED.secret), 'fencing-token': SEEDED_TOKEN, 'fence-key': t.fenceKey, 'content-type': 'text/plain' },
    body: 'seed',
  });
  expect(res.status, await res.text()).toBe(200);
}

async function readObject(db: TestDatabase, t: Target): Promise<string | null> {
  const { rows } = await db.pool.query<{ body: string }>(
    `SELECT convert_from(body, 'UTF8') AS body FROM fencepost.objects WHERE key = $1`,
    [t.dataKey],
  );
  return rows[0]?.body ?? null;
}

const UPSERT = 'INSERT INTO public.rule_data (id, v) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v';

const transaction = (sql: SqlProxy, secret: string, t: Target, token: string, v: string) =>
  fetch(`${sql.proxy.url}/v1/transactions`, {
    method: 'POST',
    headers: { ...bearer(secret), 'content-type': 'application/json' },
    body: JSON.stringify({ fences: [{ key: t.fenceKey, token }], statements: [{ sql: UPSERT, params: [t.dataKey, v] }] }),
  });

async function seedRow(sql: SqlProxy, t: Target): Promise<void> {
  const res = await transaction(sql, SEED.secret, t, SEEDED_TOKEN, 'seed');
  expect(res.status, await res.text()).toBe(200);
}

async function readRow(db: TestDatabase, t: Target): Promise<string | null> {
  const { rows } = await db.pool.query<{ v: string }>('SELECT v FROM public.rule_data WHERE id = $1', [t.dataKey]);
  return rows[0]?.v ?? null;
}

const DOORS: Door[] = [
  {
    name: 'object PUT',
    seed: seedObject,
    write: async (sql, t, token) =>
      httpOutcome(
        await fetch(objectUrl(sql, t.dataKey), {
          method: 'PUT',
          headers: { ...bearer(WRITER.secret), 'fencing-token': token, 'fence-key': t.fenceKey, 'content-type': 'text/plain' },
          body: 'written',
        }),
        200,
      ),
    read: readObject,
    written: 'written',
  },
  {
    name: 'object DELETE',
    seed: seedObject,
    write: async (sql, t, token) =>
      httpOutcome(
        await fetch(objectUrl(sql, t.dataKey), {
          method: 'DELETE',
          headers: { ...bearer(WRITER.secret), 'fencing-token': token, 'fence-key': t.fenceKey },
        }),
        204,
      ),
    read: readObject,
    written: null,
  },
  {
    name: 'POST /v1/transactions',
    seed: seedRow,
    write: async (sql, t, token) => httpOutcome(await transaction(sql, WRITER.secret, t, token, 'written'), 200),
    read: readRow,
    written: 'written',
  },
  {
    name: 'SQL endpoint',
    seed: seedRow,
    write: async (sql, t, token) => {
      let client: pg.Client | undefined;
      try {
        client = await sql.connect(WRITER.name, { password: WRITER.secret, options: fenceOptions(token, t.fenceKey) });
        await client.query(UPSERT, [t.dataKey, 'written']);
        return 'accepted';
      } catch (err) {
        const code = (err as { code?: string }).code ?? String(err);
        return SQL_OUTCOME[code] ?? `unexpected ${code}`;
      } finally {
        await client?.end();
      }
    },
    read: readRow,
    written: 'written',
  },
];

interface Case {
  name: string;
  token: string;
  /** Whether the fence key is under the writer key's prefixes. */
  inPrefixes: boolean;
  outcome: Outcome;
  /** The fence's highest token after the write. */
  fenceAfter: string;
}

// From a fence at 5: only an accepted write moves the data, and only a higher token moves the fence.
const CASES: Case[] = [
  { name: 'equal token', token: '5', inPrefixes: true, outcome: 'accepted', fenceAfter: '5' },
  { name: 'higher token', token: '6', inPrefixes: true, outcome: 'accepted', fenceAfter: '6' },
  { name: 'lower token', token: '4', inPrefixes: true, outcome: 'stale', fenceAfter: '5' },
  { name: 'malformed token (not digits)', token: '5x', inPrefixes: true, outcome: 'invalid', fenceAfter: '5' },
  { name: 'malformed token (2^63, out of range)', token: '9223372036854775808', inPrefixes: true, outcome: 'invalid', fenceAfter: '5' },
  { name: "fence key outside the key's prefixes", token: '5', inPrefixes: false, outcome: 'forbidden', fenceAfter: '5' },
];

const slug = (s: string) => s.replace(/[^a-z0-9]+/gi, '-').toLowerCase();

for (const c of CASES) {
  test(`${c.name}: ${c.outcome} on every door, fence 5 → ${c.fenceAfter}, data ${c.outcome === 'accepted' ? 'written' : 'untouched'}`, async ({
    db,
    sql,
  }) => {
    const seen: Record<string, { outcome: string; highestToken: string | undefined; data: string | null }> = {};
    const want: typeof seen = {};
    for (const door of DOORS) {
      const t: Target = {
        fenceKey: `rule/${c.inPrefixes ? 'in' : 'out'}/${slug(c.name)}/${slug(door.name)}`,
        dataKey: `rule/in/data/${slug(c.name)}/${slug(door.name)}`,
      };
      await door.seed(sql, t);
      const outcome = await door.write(sql, t, c.token);
      seen[door.name] = { outcome, highestToken: (await fenceRow(db.pool, t.fenceKey))?.highest_token, data: await door.read(db, t) };
      want[door.name] = { outcome: c.outcome, highestToken: c.fenceAfter, data: c.outcome === 'accepted' ? door.written : 'seed' };
    }
    expect(seen).toEqual(want);
  });
}
