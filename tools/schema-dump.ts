// The fencepost schemas as SQL that applies, from the catalogs (as pg_dump --schema-only would
// write them, but in an order and form that does not change with an upgrade path): schemas,
// sequences, functions, tables, views, then foreign keys, indexes, triggers and sequence
// ownership, each object followed by the privileges it has beyond its defaults. Everything in name
// order; the owner is whoever applies it (CURRENT_USER). migrations/schema.sql is a fresh
// install's, checked by test/fence/schema.test.ts: a fresh install, every upgrade, and the file
// applied to an empty database all dump the same.
//
// `npm run schema:dump` writes migrations/schema.sql from a fresh database (on DATABASE_URL's
// server, else an embedded Postgres).
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { migrate } from '../src/fence/migrate.ts';
import { startEmbeddedPostgres } from '../src/fence/embedded-postgres.ts';

export const SCHEMA_FILE = join(import.meta.dirname, '..', 'migrations', 'schema.sql');

/** The fence's schemas: its tables and own functions, and the functions clients call (definitions.ts CLIENT_SCHEMA). */
export const FENCE_SCHEMAS = ['fencepost', 'fencepost_api'] as const;

/** The server major a dump was made on, from its first line. */
export function dumpedOn(dump: string): string | undefined {
  return /PostgreSQL (\d+)/.exec(dump.split('\n', 1)[0] ?? '')?.[1];
}

type Query = <R extends pg.QueryResultRow>(text: string, values?: unknown[]) => Promise<R[]>;

export async function dumpSchema(pool: pg.Pool, schemas: readonly string[] = FENCE_SCHEMAS): Promise<string> {
  // Definitions print names qualified by schema only on a search_path that holds none of ours.
  const client = await pool.connect();
  try {
    await client.query('SET search_path = pg_catalog');
    const one: Query = async (text, values = []) => (await client.query(text, values)).rows;
    return await dumpWith(one, schemas);
  } finally {
    await client.query('RESET search_path').catch(() => {});
    client.release();
  }
}

/** GRANT and REVOKE statements that take `target` from its default privileges to `acl` (null: the defaults). */
async function privileges(one: Query, target: string, acl: string | null, kind: 'r' | 's' | 'f' | 'n', owner: number): Promise<string[]> {
  if (acl === null) return [];
  const grants = (sql: string, values: unknown[]) =>
    one<{ grantee: string; grantable: boolean; privs: string }>(
      `SELECT * FROM (
         SELECT CASE WHEN e.grantee = 0 THEN 'PUBLIC' WHEN e.grantee = $2 THEN 'CURRENT_USER' ELSE quote_ident(r.rolname) END AS grantee,
                e.is_grantable AS grantable, string_agg(e.privilege_type, ', ' ORDER BY e.privilege_type) AS privs
         FROM aclexplode(${sql}) e LEFT JOIN pg_roles r ON r.oid = e.grantee
         GROUP BY 1, 2
       ) g ORDER BY g.grantee COLLATE "C", g.grantable`,
      values,
    );
  const key = (g: { grantee: string; grantable: boolean; privs: string }) => `${g.grantee} ${g.grantable} ${g.privs}`;
  const actual = await grants('$1::aclitem[]', [acl, owner]);
  const defaults = await grants('acldefault($1::"char", $2::oid)', [kind, owner]);
  const out: string[] = [];
  const had = new Set(defaults.map(key));
  const has = new Set(actual.map(key));
  for (const g of defaults) if (!has.has(key(g))) out.push(`REVOKE ALL ON ${target} FROM ${g.grantee};`);
  for (const g of actual) {
    if (!had.has(key(g)))
      out.push(`GRANT ${g.privs} ON ${target} TO ${g.grantee}${g.grantable && g.grantee !== 'CURRENT_USER' ? ' WITH GRANT OPTION' : ''};`);
  }
  return out;
}

async function dumpWith(one: Query, schemas: readonly string[]): Promise<string> {
  const major = (await one<{ v: string }>(`SELECT current_setting('server_version_num') AS v`))[0]!.v.slice(0, -4);
  const out: string[] = [
    `-- The ${schemas.join(' and ')} schemas a fresh install leaves (PostgreSQL ${major}), from tools/schema-dump.ts.`,
    '-- Installs use migrate() (migrations/ and src/fence/definitions.ts), which makes exactly this; it applies to an',
    '-- empty database too (psql -f), as the role that is to own it. Regenerate with `npm run schema:dump`.',
    '',
    'SET check_function_bodies = false;',
  ];
  const nss = await one<{ oid: number; name: string; owner: number; acl: string | null }>(
    `SELECT oid, nspname AS name, nspowner::oid AS owner, nspacl::text AS acl FROM pg_namespace WHERE nspname = ANY($1::text[]) ORDER BY nspname COLLATE "C"`,
    [schemas],
  );
  for (const missing of schemas.filter((n) => !nss.some((ns) => ns.name === n))) throw new Error(`no schema ${missing}`);
  const owner = nss[0]!.owner;
  const oids = nss.map((n) => n.oid);
  const section = (title: string) => out.push('', `-- ${title}`, '');
  section('Schemas');
  for (const ns of nss) out.push(`CREATE SCHEMA ${ns.name};`, ...(await privileges(one, `SCHEMA ${ns.name}`, ns.acl, 'n', ns.owner)));

  const rels = await one<{ oid: number; name: string; kind: string; persistence: string; acl: string | null; owned: boolean }>(
    `SELECT c.oid, c.oid::regclass::text AS name, c.relkind::text AS kind, c.relpersistence::text AS persistence, c.relacl::text AS acl,
            EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i') AS owned
     FROM pg_class c WHERE c.relnamespace = ANY($1::oid[]) AND c.relkind IN ('r', 'p', 'v', 'm', 'S') ORDER BY c.oid::regclass::text COLLATE "C"`,
    [oids],
  );
  section('Sequences');
  for (const r of rels.filter((x) => x.kind === 'S' && !x.owned)) {
    const q = (
      await one<{ type: string; start: string; inc: string; min: string; max: string; cache: string; cycle: boolean }>(
        `SELECT format_type(seqtypid, NULL) AS type, seqstart AS start, seqincrement AS inc, seqmin AS min, seqmax AS max, seqcache AS cache, seqcycle AS cycle
         FROM pg_sequence WHERE seqrelid = $1`,
        [r.oid],
      )
    )[0]!;
    out.push(
      `CREATE ${r.persistence === 'u' ? 'UNLOGGED ' : ''}SEQUENCE ${r.name} AS ${q.type} START ${q.start} INCREMENT ${q.inc} MINVALUE ${q.min} MAXVALUE ${q.max} CACHE ${q.cache}${q.cycle ? ' CYCLE' : ''};`,
      ...(await privileges(one, `SEQUENCE ${r.name}`, r.acl, 's', owner)),
    );
  }

  section('Functions');
  const fns = await one<{ sig: string; def: string; acl: string | null }>(
    `SELECT p.oid::regprocedure::text AS sig, pg_get_functiondef(p.oid) AS def, p.proacl::text AS acl
     FROM pg_proc p WHERE p.pronamespace = ANY($1::oid[]) ORDER BY p.oid::regprocedure::text COLLATE "C"`,
    [oids],
  );
  for (const f of fns) {
    out.push(`${f.def.trimEnd()};`, ...(await privileges(one, `ROUTINE ${f.sig}`, f.acl, 'f', owner)), ''); // ROUTINE: functions and procedures
  }
  if (out.at(-1) === '') out.pop();

  section('Tables');
  const later: string[] = [];
  for (const r of rels.filter((x) => x.kind === 'r' || x.kind === 'p')) {
    const cols = await one<{ name: string; type: string; notnull: boolean; def: string | null; identity: string; generated: string }>(
      `SELECT quote_ident(a.attname) AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS notnull, pg_get_expr(d.adbin, d.adrelid) AS def,
         a.attidentity::text AS identity, a.attgenerated::text AS generated
       FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
       WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`,
      [r.oid],
    );
    // NOT NULL is a column's (Postgres 18 also lists it as a constraint); foreign keys come once every table exists.
    const cons = await one<{ name: string; def: string; fk: boolean }>(
      `SELECT quote_ident(conname) AS name, pg_get_constraintdef(oid) AS def, contype = 'f' AS fk
       FROM pg_constraint WHERE conrelid = $1 AND contype <> 'n' ORDER BY conname COLLATE "C"`,
      [r.oid],
    );
    const lines = [
      ...cols.map((c) => {
        const gen = c.generated === 's' ? ` GENERATED ALWAYS AS (${c.def}) STORED` : c.def !== null ? ` DEFAULT ${c.def}` : '';
        const ident = c.identity === 'a' ? ' GENERATED ALWAYS AS IDENTITY' : c.identity === 'd' ? ' GENERATED BY DEFAULT AS IDENTITY' : '';
        return `  ${c.name} ${c.type}${c.notnull ? ' NOT NULL' : ''}${gen}${ident}`;
      }),
      ...cons.filter((c) => !c.fk).map((c) => `  CONSTRAINT ${c.name} ${c.def}`),
    ];
    out.push(
      `CREATE ${r.persistence === 'u' ? 'UNLOGGED ' : ''}TABLE ${r.name} (\n${lines.join(',\n')}\n);`,
      ...(await privileges(one, `TABLE ${r.name}`, r.acl, 'r', owner)),
      '',
    );
    for (const c of cons.filter((x) => x.fk)) later.push(`ALTER TABLE ${r.name} ADD CONSTRAINT ${c.name} ${c.def};`);
  }
  if (out.at(-1) === '') out.pop();

  section('Views');
  // In the order they were made, so each comes after what it reads.
  const views = rels.filter((x) => x.kind === 'v' || x.kind === 'm').sort((a, b) => a.oid - b.oid);
  for (const r of views) {
    const def = (await one<{ def: string }>(`SELECT pg_get_viewdef($1::oid, true) AS def`, [r.oid]))[0]!.def;
    out.push(
      `CREATE ${r.kind === 'm' ? 'MATERIALIZED ' : ''}VIEW ${r.name} AS\n${def.trimEnd()}`,
      ...(await privileges(one, `TABLE ${r.name}`, r.acl, 'r', owner)),
      '',
    );
  }
  if (out.at(-1) === '') out.pop();

  section('Foreign keys, indexes (those no constraint makes), triggers, sequence ownership');
  out.push(...later);
  const tables = rels.filter((x) => x.kind === 'r' || x.kind === 'p' || x.kind === 'm').map((x) => x.oid);
  for (const i of await one<{ def: string }>(
    `SELECT pg_get_indexdef(i.indexrelid) AS def FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = ANY($1::oid[]) AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid)
     ORDER BY i.indrelid::regclass::text COLLATE "C", c.relname COLLATE "C"`,
    [tables],
  )) {
    out.push(`${i.def};`);
  }
  for (const t of await one<{ def: string }>(
    `SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger WHERE tgrelid = ANY($1::oid[]) AND NOT tgisinternal
     ORDER BY tgrelid::regclass::text COLLATE "C", tgname COLLATE "C"`,
    [tables],
  )) {
    out.push(`${t.def};`);
  }
  for (const o of await one<{ seq: string; tab: string; col: string }>(
    `SELECT * FROM (SELECT d.objid::regclass::text AS seq, d.refobjid::regclass::text AS tab, quote_ident(a.attname) AS col
     FROM pg_depend d JOIN pg_class s ON s.oid = d.objid JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
     WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'a' AND s.relkind = 'S'
       AND s.relnamespace = ANY($1::oid[])) o ORDER BY o.seq COLLATE "C"`,
    [oids],
  )) {
    out.push(`ALTER SEQUENCE ${o.seq} OWNED BY ${o.tab}.${o.col};`);
  }
  return `${out.join('\n')}\n`;
}

/** A fresh database on `adminUrl`'s server, migrated, dumped, dropped. */
export async function dumpFreshInstall(adminUrl: string): Promise<string> {
  const name = `fencepost_schema_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const pool = new pg.Pool({ connectionString: url.toString(), max: 2 });
  pool.on('error', () => {}); // an idle connection cut by DROP DATABASE … FORCE
  try {
    await migrate(pool);
    return await dumpSchema(pool);
  } finally {
    await pool.end();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  }
}

async function main(): Promise<void> {
  if (process.env.DATABASE_URL) {
    writeFileSync(SCHEMA_FILE, await dumpFreshInstall(process.env.DATABASE_URL));
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-schema-'));
  chmodSync(dir, 0o755); // Postgres runs as the postgres user when we are root
  const running = await startEmbeddedPostgres({ dataDir: join(dir, 'data'), port: 0 });
  try {
    writeFileSync(SCHEMA_FILE, await dumpFreshInstall(running.url));
  } finally {
    await running.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] === join(import.meta.dirname, 'schema-dump.ts')) {
  main().then(
    () => process.stdout.write(`wrote ${SCHEMA_FILE}\n`),
    (err: unknown) => {
      process.stderr.write(`schema-dump: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
