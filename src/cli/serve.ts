import { loadConfig } from '../proxy/config.ts';
import { createLogger, createPool, startProxy } from '../proxy/server.ts';
import { migrate } from '../fence/migrate.ts';

export async function serveCommand(): Promise<number> {
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const proxy = await startProxy(config, logger);
  await new Promise<void>((resolve) => {
    const stop = (signal: NodeJS.Signals) => {
      logger.info({ signal }, 'signal received');
      resolve();
    };
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
  });
  await proxy.close();
  return 0;
}

export async function migrateCommand(): Promise<number> {
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const embedded =
    config.databaseUrl === null ? await (await import('../fence/embedded-postgres.ts')).startEmbeddedPostgres({ dataDir: config.dataDir, port: config.embeddedPgPort }) : null;
  const pool = createPool(config.databaseUrl ?? embedded!.url, 2);
  try {
    const applied = await migrate(pool);
    logger.info({ applied }, applied.length ? 'migrations applied' : 'database is up to date');
  } finally {
    await pool.end();
    await embedded?.stop();
  }
  return 0;
}
