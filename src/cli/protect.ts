// `fencepost protect` and `fencepost unprotect`: declare what a fence key guards (src/fence/protect.ts).
// They run against DATABASE_URL (or the embedded Postgres a running `fencepost serve` keeps:
// database.ts), migrating it first, say on stderr which database they used, and exit.
import { parseArgs } from 'node:util';
import { loadConfig } from '../proxy/config.ts';
import { createPool } from '../proxy/server.ts';
import { commandDatabase } from './database.ts';
import { databaseError } from '../proxy/startup-errors.ts';
import { migrate, listProtected, protectPrefix, protectTable, unprotectPrefix, unprotectTable, ProtectError } from '../fence/admin.ts';
import type pg from 'pg';

export const PROTECT_USAGE = `usage: fencepost protect <schema.table> --fence-key <key>
       fencepost protect --prefix <object-key-prefix> --fence-key <key>
       fencepost protect --list
  Postgres refuses INSERT, UPDATE, DELETE, TRUNCATE, COPY FROM and MERGE on the table (and its
  partitions) in any transaction that did not pass the fence of <key>: through the SQL endpoint
  or POST /v1/transactions with that fence key at its highest token, or not at all. Objects whose
  keys start with a protected prefix are fenced by its key, whatever Fence-Key says.
  Settings: DATABASE_URL; unset, the embedded Postgres a running \`fencepost serve\` keeps on
  FENCEPOST_DATA_DIR (or this checkout's default folder), as for \`fencepost serve\`.`;

export const UNPROTECT_USAGE = `usage: fencepost unprotect <schema.table> | --prefix <object-key-prefix>
  Takes the protection off a table (and its partitions) or an object-key prefix.`;

async function withPool<T>(command: string, work: (pool: pg.Pool) => Promise<T>): Promise<T> {
  loadConfig(); // a bad setting is refused as serve refuses it
  const database = commandDatabase(command);
  process.stderr.write(`fencepost ${command}: database ${database.description}\n`);
  const pool = createPool(database.url, 2);
  try {
    await migrate(pool).catch((err: unknown) => {
      throw databaseError(err, database.setting, database.url);
    });
    return await work(pool);
  } finally {
    await pool.end();
  }
}

function usageError(command: string, usage: string, message: string): number {
  process.stderr.write(`fencepost ${command}: ${message}\n${usage}\n`);
  return 2;
}

async function report(work: () => Promise<void>): Promise<number> {
  try {
    await work();
    return 0;
  } catch (err) {
    if (!(err instanceof ProtectError)) throw err;
    process.stderr.write(`fencepost: ${err.message}${err.sql.length ? `\n  ${err.sql.join(';\n  ')};` : ''}\n`);
    return 1;
  }
}

export async function protectCommand(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        'fence-key': { type: 'string' },
        prefix: { type: 'string' },
        list: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: true,
    });
  } catch (err) {
    return usageError('protect', PROTECT_USAGE, (err as Error).message);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    process.stdout.write(PROTECT_USAGE + '\n');
    return 0;
  }
  if (values.list) {
    if (positionals.length > 0 || values.prefix !== undefined || values['fence-key'] !== undefined)
      return usageError('protect', PROTECT_USAGE, '--list takes nothing else');
    return withPool('protect', async (pool) => {
      const items = await listProtected(pool);
      if (items.length === 0) process.stdout.write('nothing is protected\n');
      for (const i of items)
        process.stdout.write(
          `${i.kind}\t${i.target}\t${i.fenceKey}${i.enforced ? '' : `\tNOT ENFORCED: ${i.whyNot ?? "its trigger is not the fence's"} (run protect again)`}\n`,
        );
      return 0;
    });
  }
  const fenceKey = values['fence-key'];
  if (fenceKey === undefined) return usageError('protect', PROTECT_USAGE, '--fence-key is required');
  const prefix = values.prefix;
  if ((prefix === undefined) === (positionals.length !== 1) || positionals.length > 1)
    return usageError('protect', PROTECT_USAGE, 'name one table, or one --prefix');
  return withPool('protect', (pool) =>
    report(async () => {
      if (prefix !== undefined) {
        await protectPrefix(pool, prefix, fenceKey);
        process.stdout.write(`objects under ${JSON.stringify(prefix)} are fenced by ${JSON.stringify(fenceKey)}\n`);
        return;
      }
      const { tables, owners } = await protectTable(pool, positionals[0]!, fenceKey);
      process.stdout.write(`protected by fence key ${JSON.stringify(fenceKey)}: ${tables.join(', ')}\n`);
      process.stdout.write(
        `owner${owners.length > 1 ? 's' : ''} ${owners.join(', ')} can drop the trigger: writers must not use ${owners.length > 1 ? 'these roles' : 'this role'}\n`,
      );
    }),
  );
}

export async function unprotectCommand(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: { prefix: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      strict: true,
      allowPositionals: true,
    });
  } catch (err) {
    return usageError('unprotect', UNPROTECT_USAGE, (err as Error).message);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    process.stdout.write(UNPROTECT_USAGE + '\n');
    return 0;
  }
  const prefix = values.prefix;
  if ((prefix === undefined) === (positionals.length !== 1) || positionals.length > 1)
    return usageError('unprotect', UNPROTECT_USAGE, 'name one table, or one --prefix');
  return withPool('unprotect', (pool) =>
    report(async () => {
      if (prefix !== undefined) {
        const removed = await unprotectPrefix(pool, prefix);
        process.stdout.write(
          removed ? `prefix ${JSON.stringify(prefix)} is no longer protected\n` : `prefix ${JSON.stringify(prefix)} was not protected\n`,
        );
        return;
      }
      const tables = await unprotectTable(pool, positionals[0]!);
      process.stdout.write(`no longer protected: ${tables.join(', ')}\n`);
    }),
  );
}
