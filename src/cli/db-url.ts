// `fencepost db-url`: prints the URL of the database `migrate`, `protect` and `doctor` use
// (database.ts): DATABASE_URL, else the embedded Postgres a running `fencepost serve` keeps, with
// its superuser's password, for `psql "$(fencepost db-url)"`. Nothing on stderr when it prints
// one; with none, one line saying what to set, exit 1.
import { parseArgs } from 'node:util';
import { commandDatabase } from './database.ts';

export const DB_URL_USAGE = `usage: fencepost db-url
  Prints the URL of the database the other commands use: DATABASE_URL when set, else the
  embedded Postgres a running \`fencepost serve\` keeps on FENCEPOST_DATA_DIR (or this checkout's
  default folder), as its superuser (the password included: the file it is read from is readable
  by its owner only). Exits 1, saying what to set, when there is none:
    psql "$(fencepost db-url)"`;

export function dbUrlCommand(argv: string[], env: NodeJS.ProcessEnv = process.env): number {
  let values;
  try {
    ({ values } = parseArgs({ args: argv, options: { help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false }));
  } catch (err) {
    process.stderr.write(`fencepost db-url: ${(err as Error).message}\n${DB_URL_USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(DB_URL_USAGE + '\n');
    return 0;
  }
  process.stdout.write(`${commandDatabase('db-url', env).url}\n`);
  return 0;
}
