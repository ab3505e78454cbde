// `fencepost doctor --zk <connect> [--window-ms <n>] [--session-timeout-ms <n>] [--json]`: measures
// ZooKeeper round trips and this process's event-loop stalls and recommends a session timeout.
import { parseArgs } from 'node:util';
import { formatAdvice, measureSessionTimeoutAdvice } from '../election/advice.ts';

export const DOCTOR_USAGE = 'usage: fencepost doctor --zk <connect-string> [--window-ms <n>] [--session-timeout-ms <n>] [--json]';

export async function doctorCommand(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        zk: { type: 'string' },
        'window-ms': { type: 'string' },
        'session-timeout-ms': { type: 'string' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }));
  } catch (err) {
    process.stderr.write(`fencepost doctor: ${(err as Error).message}\n${DOCTOR_USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(DOCTOR_USAGE + '\n');
    return 0;
  }
  const positiveInt = (raw: string | undefined, name: string): number | undefined | null => {
    if (raw === undefined) return undefined;
    return /^\d+$/.test(raw) && Number(raw) > 0 ? Number(raw) : (process.stderr.write(`fencepost doctor: ${name} must be a positive integer\n`), null);
  };
  const windowMs = positiveInt(values['window-ms'], '--window-ms');
  const configured = positiveInt(values['session-timeout-ms'], '--session-timeout-ms');
  if (!values.zk || windowMs === null || configured === null) {
    if (!values.zk) process.stderr.write(`fencepost doctor: --zk is required\n${DOCTOR_USAGE}\n`);
    return 2;
  }
  // Progress on stderr (stdout carries the result, e.g. --json for scripts).
  let advice;
  try {
    advice = await measureSessionTimeoutAdvice({
      connect: values.zk,
      windowMs: windowMs ?? 5000,
      onProgress: (step) => process.stderr.write(`fencepost doctor: ${step}…\n`),
    });
  } catch (err) {
    process.stderr.write(`fencepost doctor: --zk ${values.zk}: ${(err as Error).message.split('\n')[0]}\n`);
    return 1;
  }
  if (values.json) {
    process.stdout.write(JSON.stringify({ ...advice, configuredSessionTimeoutMs: configured ?? null }) + '\n');
  } else {
    process.stdout.write(formatAdvice(advice, configured) + '\n');
  }
  return 0;
}
