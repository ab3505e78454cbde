// `fencepost <command>`: serve | migrate | db-url | elect | doctor | leader | protect | unprotect | demo.
// (The chaos harness: tools/cli.ts.)
import { readFileSync } from 'node:fs';
import { ConfigError } from '../proxy/config.ts';
import { StartupError } from '../proxy/startup-errors.ts';
import { CommandFailure } from './command-failure.ts';

const USAGE = `usage: fencepost <command> [--help]   (fencepost --version)
  serve     run the fencing proxy (PORT, HOST, DATABASE_URL, FENCEPOST_* settings)
  migrate   apply pending migrations to DATABASE_URL (or the embedded Postgres a running serve keeps)
  db-url    print the URL of that database (DATABASE_URL, or the running embedded Postgres's)
  elect     run a command only while elected leader through ZooKeeper
  doctor    measure ZooKeeper latency and event-loop stalls, advise a session timeout; check Postgres failover durability
  leader    print the current leader of an election path and its token
  protect   declare a table or an object-key prefix protected by a fence key (Postgres enforces it)
  unprotect take that protection off
  demo      the forced-pause demo: a leader frozen past its session timeout comes back, and its write is refused`;

/** This package's version (src/cli/ and dist/cli/ are both two levels below package.json). */
function version(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  return pkg.version;
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'serve': {
      const { serveCommand } = await import('./serve.ts');
      return await serveCommand(rest);
    }
    case 'migrate': {
      const { migrateCommand } = await import('./serve.ts');
      return await migrateCommand(rest);
    }
    case 'db-url': {
      const { dbUrlCommand } = await import('./db-url.ts');
      return dbUrlCommand(rest);
    }
    case 'elect': {
      const { electCommand } = await import('./elect.ts');
      return await electCommand(rest);
    }
    case 'doctor': {
      const { doctorCommand } = await import('./doctor.ts');
      return await doctorCommand(rest);
    }
    case 'leader': {
      const { leaderCommand } = await import('./leader.ts');
      return await leaderCommand(rest);
    }
    case 'protect': {
      const { protectCommand } = await import('./protect.ts');
      return await protectCommand(rest);
    }
    case 'unprotect': {
      const { unprotectCommand } = await import('./protect.ts');
      return await unprotectCommand(rest);
    }
    case 'demo': {
      const { demoCommand } = await import('./demo.ts');
      return await demoCommand(rest);
    }
    case '--version':
    case '-v':
      process.stdout.write(`fencepost ${version()}\n`);
      return 0;
    case undefined:
    case '-h':
    case '--help':
    case 'help':
      process.stdout.write(USAGE + '\n');
      return command === undefined ? 2 : 0;
    default:
      process.stderr.write(`fencepost: unknown command ${JSON.stringify(command)}\n${USAGE}\n`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    // Settings that are wrong or cannot be used: one line naming the setting, no stack.
    if (err instanceof ConfigError) process.stderr.write(`fencepost: invalid configuration: ${err.message}\n`);
    else if (err instanceof StartupError) process.stderr.write(`fencepost: cannot start: ${err.message}\n`);
    else if (err instanceof CommandFailure) process.stderr.write(`fencepost ${err.command}: ${err.message}\n`);
    else process.stderr.write(`fencepost: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
