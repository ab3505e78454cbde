// `fencepost serve [--port <n>] [--host <addr>]` and `fencepost migrate`: the proxy, and its
// migrations alone. Settings come from the environment (docs/configuration.md); the flags mirror
// PORT and HOST and win over them.
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig, type ProxyConfig } from '../proxy/config.ts';
import { createLogger, createPool, startProxy } from '../proxy/server.ts';
import { commandDatabase } from './database.ts';
import { StartupError, databaseError } from '../proxy/startup-errors.ts';
import { migrate } from '../fence/admin.ts';

export const SERVE_USAGE = `usage: fencepost serve [--port <n>] [--host <addr>]
  Runs the fencing proxy. Settings come from the environment (docs/configuration.md):
  DATABASE_URL (unset: an embedded Postgres), PORT, HOST, FENCEPOST_TLS_CERT/_KEY, FENCEPOST_*.
  --port <n>      HTTP port (same as PORT; the flag wins)
  --host <addr>   HTTP address (same as HOST; the flag wins)
  SIGTERM/SIGINT: finish in-flight requests and stop; SIGHUP: reload the TLS certificate and key.`;

export const MIGRATE_USAGE = `usage: fencepost migrate
  Applies pending migrations (migrations/*.sql) to DATABASE_URL, or, when it is unset, to the
  embedded Postgres a running \`fencepost serve\` keeps on FENCEPOST_DATA_DIR (or this checkout's
  default folder), and exits. It starts no Postgres of its own: serve migrates at start.`;

/** Parses a subcommand's flags; a usage error prints the usage and yields exit code 2. */
function parseFlags<T extends Record<string, { type: 'string' | 'boolean' }>>(command: string, usage: string, argv: string[], options: T) {
  try {
    return parseArgs({ args: argv, options: { ...options, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false })
      .values;
  } catch (err) {
    process.stderr.write(`fencepost ${command}: ${(err as Error).message}\n${usage}\n`);
    return null;
  }
}

/** PORT / HOST errors say `--port` / `--host` when the value came from the flag. */
function renameFlagSetting(err: unknown, flags: { port?: string | undefined; host?: string | undefined }): unknown {
  const setting = err instanceof ConfigError ? err.variable : err instanceof StartupError ? err.setting : null;
  const flag = setting === 'PORT' && flags.port !== undefined ? '--port' : setting === 'HOST' && flags.host !== undefined ? '--host' : null;
  if (flag === null || !(err instanceof Error)) return err;
  const message = err.message.slice(setting!.length + 2);
  return err instanceof ConfigError ? new ConfigError(flag, message) : new StartupError(flag, message, { cause: err });
}

export async function serveCommand(argv: string[] = []): Promise<number> {
  const flags = parseFlags('serve', SERVE_USAGE, argv, { port: { type: 'string' }, host: { type: 'string' } });
  if (flags === null) return 2;
  if (flags.help) {
    process.stdout.write(SERVE_USAGE + '\n');
    return 0;
  }
  const port = typeof flags.port === 'string' ? flags.port : undefined;
  const host = typeof flags.host === 'string' ? flags.host : undefined;
  let config: Readonly<ProxyConfig>;
  let proxy: Awaited<ReturnType<typeof startProxy>>;
  const env = { ...process.env, ...(port !== undefined ? { PORT: port } : {}), ...(host !== undefined ? { HOST: host } : {}) };
  try {
    config = loadConfig(env);
  } catch (err) {
    throw renameFlagSetting(err, { port, host });
  }
  const logger = createLogger(config.logLevel);
  try {
    proxy = await startProxy(config, logger);
  } catch (err) {
    throw renameFlagSetting(err, { port, host });
  }
  // Without TLS, SIGHUP keeps its default (the process ends, as a terminal's hang-up should end it).
  const reload = () => void proxy.reloadTls();
  if (proxy.tls) process.on('SIGHUP', reload);
  let orphanWatch: NodeJS.Timeout | undefined;
  await new Promise<void>((resolve) => {
    const stop = (signal: NodeJS.Signals) => {
      logger.info({ signal }, 'signal received');
      resolve();
    };
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
    // Started by npm (npm start, npm exec, npx): npm does not pass a SIGTERM on to its child, so
    // when npm goes, this process is reparented. Stop then, as on SIGTERM, rather than hold the ports.
    if (process.env.npm_command !== undefined) {
      const parent = process.ppid;
      orphanWatch = setInterval(() => {
        if (process.ppid === parent) return;
        logger.info({ parent }, 'the npm process that started this one is gone: stopping');
        resolve();
      }, 500);
      orphanWatch.unref();
    }
  });
  clearInterval(orphanWatch);
  await proxy.close();
  process.off('SIGHUP', reload);
  return 0;
}

export async function migrateCommand(argv: string[] = []): Promise<number> {
  const flags = parseFlags('migrate', MIGRATE_USAGE, argv, {});
  if (flags === null) return 2;
  if (flags.help) {
    process.stdout.write(MIGRATE_USAGE + '\n');
    return 0;
  }
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const database = commandDatabase('migrate');
  process.stderr.write(`fencepost migrate: database ${database.description}\n`);
  const pool = createPool(database.url, 2);
  try {
    const applied = await migrate(pool).catch((err: unknown) => {
      throw databaseError(err, database.setting, database.url);
    });
    logger.info({ applied }, applied.length ? 'migrations applied' : 'database is up to date');
  } finally {
    await pool.end();
  }
  return 0;
}
