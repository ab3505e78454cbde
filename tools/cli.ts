// The harness's processes, run with tsx (`node --import tsx tools/cli.ts <command>`):
//   demo-writer   one replica of the demo (src/demo/writer.ts): docker-compose.yml's writers
//   chaos-writer  one writer process of `npm run chaos`
//   tenancy-attacker  tenant A of the tenant-isolation harness (tools/tenancy/attacker.ts)
//   serve         `fencepost serve`, optionally with a broken fence: --fence-mode off|two-step
//                 (the checkers' self-tests and the benchmark's unfenced baseline)
import { join } from 'node:path';
import { parseArgs } from 'node:util';

/** argv prefix that runs a tools command in a child process. */
export const TOOLS_CLI = ['--import', 'tsx', join(import.meta.dirname, 'cli.ts')];

async function serveUnsafe(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { 'fence-mode': { type: 'string', default: 'strict' } }, strict: true });
  const { FENCE_MODES, unsafeStrategy } = await import('./unsafe-fence.ts');
  const mode = values['fence-mode'] as (typeof FENCE_MODES)[number];
  if (!FENCE_MODES.includes(mode)) {
    process.stderr.write(`tools serve: --fence-mode must be one of ${FENCE_MODES.join(', ')}\n`);
    return 2;
  }
  const { loadConfig } = await import('../src/proxy/config.ts');
  const { startProxy, createLogger } = await import('../src/proxy/server.ts');
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const strategy = unsafeStrategy(mode);
  if (strategy)
    logger.warn({ fenceMode: mode }, 'UNSAFE: the fence is broken on purpose (tools serve --fence-mode); stale writes can be accepted');
  const proxy = await startProxy(config, logger, strategy ? { __test__writeStrategy: strategy } : {});
  await new Promise<void>((resolve) => {
    for (const sig of ['SIGTERM', 'SIGINT'] as const) process.once(sig, () => resolve());
  });
  await proxy.close();
  return 0;
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'demo-writer':
      return await (await import('../src/demo/writer.ts')).demoWriterCommand(rest);
    case 'chaos-writer':
      return await (await import('./chaos/writer.ts')).chaosWriterCommand(rest);
    case 'tenancy-attacker':
      return await (await import('./tenancy/attacker.ts')).attackerCommand();
    case 'serve':
      return await serveUnsafe(rest);
    default:
      process.stderr.write(
        'usage: node --import tsx tools/cli.ts demo-writer|chaos-writer|tenancy-attacker|serve [--fence-mode off|two-step]\n',
      );
      return 2;
  }
}

if (process.argv[1] === join(import.meta.dirname, 'cli.ts')) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`tools: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exit(1);
    },
  );
}
