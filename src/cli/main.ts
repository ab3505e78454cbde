// `fencepost <command>`: serve | migrate | elect | doctor. (The demo and chaos harness: tools/cli.ts.)
import { ConfigError } from '../proxy/config.ts';

const USAGE = `usage: fencepost <command>
  serve     run the fencing proxy (PORT, HOST, DATABASE_URL, FENCEPOST_* settings)
  migrate   apply pending migrations to DATABASE_URL (or the embedded Postgres)
  elect     run a command only while elected leader through ZooKeeper
  doctor    measure ZooKeeper latency and event-loop stalls; advise a session timeout
  leader    print the current leader of an election path and its token`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'serve': {
      const { serveCommand } = await import('./serve.ts');
      return await serveCommand();
    }
    case 'migrate': {
      const { migrateCommand } = await import('./serve.ts');
      return await migrateCommand();
    }
    case 'elect': {
      const { fencedElectCommand } = await import('./fenced-elect.ts');
      return await fencedElectCommand(rest);
    }
    case 'doctor': {
      const { doctorCommand } = await import('./elect.ts');
      return await doctorCommand(rest);
    }
    case 'leader': {
      const { leaderCommand } = await import('./leader.ts');
      return await leaderCommand(rest);
    }
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
    if (err instanceof ConfigError) process.stderr.write(`fencepost: invalid configuration: ${err.message}\n`);
    else process.stderr.write(`fencepost: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
