// The fencepost schema as text, from the catalogs: tables (columns, constraints, indexes,
// triggers, persistence), sequences, views, functions and every privilege, in name order, with
// the schema owner's name replaced by <owner>. Version-independent enough to diff a fresh install
// against an upgraded one; migrations/schema.sql is a fresh install's, checked by
// test/fence/schema.test.ts.
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

export async function dumpSchema(pool: pg.Pool, schemas: readonly string[] = FENCE_SCHEMAS): Promise<string> {
  // Definitions print names qualified by schema only on a search_path that holds none of ours.
  const client = await pool.connect();
  try {
    await client.query('SET search_path = pg_catalog');
    const parts: string[] = [];
    for (const schema of schemas) parts.push(await dumpWith(client, schema));
    return parts.join('\n');
  } finally {
    await client.query('RESET search_path').catch(() => {});
    client.release();
  }
}

async function dumpWith(db: pg.PoolClient, schema: string): Promise<string> {
  const one = async <R extends pg.QueryResultRow>(text: string, values: unknown[] = []) => (await db.query<R>(text, values)).rows;
  const ns = (
    await one<{ oid: number; owner: string; acl: string | null }>(
      `SELECT oid, nspowner::regrole::text AS owner, nspacl::text AS acl FROM pg_namespace WHERE nspname = $1`,
      [schema],
    )
  )[0];
  if (!ns) throw new Error(`no schema ${schema}`);
  const major = (await one<{ v: string }>(`SELECT current_setting('server_version_num') AS v`))[0]!.v.slice(0, -4);
  const owner = (text: string | null) => (text ?? '(default)').split(ns.owner).join('<owner>');
  const out: string[] = [
    `-- The ${schema} schema a fresh install leaves (PostgreSQL ${major}), from tools/schema-dump.ts.`,
    '-- Not applied by anything: migrations/ and src/fence/definitions.ts make it. Regenerate with `npm run schema:dump`.',
    '',
    `-- schema ${schema}: privileges ${owner(ns.acl)}`,
  ];
  const rels = await one<{ oid: number; name: string; kind: string; persistence: string; acl: string | null }>(
    `SELECT c.oid, c.relname AS name, c.relkind::text AS kind, c.relpersistence::text AS persistence, c.relacl::text AS acl
     FROM pg_class c WHERE c.relnamespace = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S') ORDER BY c.relname COLLATE "C"`,
    [ns.oid],
  );
  for (const r of rels) {
    const name = `${schema}.${r.name}`;
    out.push('');
    if (r.kind === 'v' || r.kind === 'm') {
      const def = (await one<{ def: string }>(`SELECT pg_get_viewdef($1::oid, true) AS def`, [r.oid]))[0]!.def;
      out.push(`CREATE ${r.kind === 'm' ? 'MATERIALIZED ' : ''}VIEW ${name} AS\n${def.trimEnd()}`);
    } else if (r.kind === 'S') {
      const s = (
        await one<{ type: string; start: string; inc: string; min: string; max: string; cycle: boolean }>(
          `SELECT format_type(seqtypid, NULL) AS type, seqstart AS start, seqincrement AS inc, seqmin AS min, seqmax AS max, seqcycle AS cycle FROM pg_sequence WHERE seqrelid = $1`,
          [r.oid],
        )
      )[0]!;
      out.push(
        `CREATE SEQUENCE ${name} AS ${s.type} START ${s.start} INCREMENT ${s.inc} MINVALUE ${s.min} MAXVALUE ${s.max}${s.cycle ? ' CYCLE' : ''};`,
      );
    } else {
      const cols = await one<{ name: string; type: string; notnull: boolean; def: string | null; identity: string; generated: string }>(
        `SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS notnull, pg_get_expr(d.adbin, d.adrelid) AS def,
           a.attidentity::text AS identity, a.attgenerated::text AS generated
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`,
        [r.oid],
      );
      const cons = await one<{ name: string; def: string }>(
        `SELECT conname AS name, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = $1 AND contype <> 'n' ORDER BY conname COLLATE "C"`,
        [r.oid],
      );
      const lines = [
        ...cols.map((c) => {
          const gen = c.generated === 's' ? ` GENERATED ALWAYS AS (${c.def}) STORED` : c.def !== null ? ` DEFAULT ${c.def}` : '';
          const ident =
            c.identity === 'a' ? ' GENERATED ALWAYS AS IDENTITY' : c.identity === 'd' ? ' GENERATED BY DEFAULT AS IDENTITY' : '';
          return `  ${c.name} ${c.type}${c.notnull ? ' NOT NULL' : ''}${gen}${ident}`;
        }),
        ...cons.map((c) => `  CONSTRAINT ${c.name} ${c.def}`),
      ];
      out.push(`CREATE ${r.persistence === 'u' ? 'UNLOGGED ' : ''}TABLE ${name} (\n${lines.join(',\n')}\n);`);
      for (const i of await one<{ def: string }>(
        `SELECT pg_get_indexdef(i.indexrelid) AS def FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1 ORDER BY c.relname COLLATE "C"`,
        [r.oid],
      )) {
        out.push(`${i.def};`);
      }
      for (const t of await one<{ def: string }>(
        `SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger WHERE tgrelid = $1 AND NOT tgisinternal ORDER BY tgname COLLATE "C"`,
        [r.oid],
      )) {
        out.push(`${t.def};`);
      }
    }
    out.push(`-- ${name}: privileges ${owner(r.acl)}`);
  }
  const fns = await one<{ sig: string; def: string; acl: string | null }>(
    `SELECT p.oid::regprocedure::text AS sig, pg_get_functiondef(p.oid) AS def, p.proacl::text AS acl
     FROM pg_proc p WHERE p.pronamespace = $1 ORDER BY p.oid::regprocedure::text COLLATE "C"`,
    [ns.oid],
  );
  for (const f of fns) {
    out.push('', `${f.def.trimEnd()};`, `-- ${f.sig}: privileges ${owner(f.acl)}`);
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
