import { parseArgs } from 'node:util';
import { runDemo } from './demo.ts';

export { demoWriterCommand } from './writer.ts';

const num = (v: string | undefined, name: string): number | undefined => {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new Error(`--${name} must be a whole number`);
  return Number(v);
};

export async function demoCommand(argv: string[]): Promise<number> {
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
    process.stdout.write('usage: npm run demo -- [--replicas 3] [--session-timeout-ms 3000] [--pause-ms 6000] [--interval-ms 200] [--pause-mid-transaction]\n');
    return 0;
  }
  const opts = {
    replicas: num(values.replicas, 'replicas'),
    sessionTimeoutMs: num(values['session-timeout-ms'], 'session-timeout-ms'),
    pauseMs: num(values['pause-ms'], 'pause-ms'),
    intervalMs: num(values['interval-ms'], 'interval-ms'),
    pauseMidTransaction: values['pause-mid-transaction'],
  };
  const result = await runDemo(Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)));
  return result.ok ? 0 : 1;
}
