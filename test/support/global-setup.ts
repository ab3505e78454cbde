// One real Postgres and one real ZooKeeper for the whole run; DATABASE_URL / ZK_CONNECT reuse existing ones.
import type { TestProject } from 'vitest/node';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import type { RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { LocalZooKeeper } from '../../tools/zookeeper/local-server.ts';
import { startPostgres } from '../../tools/postgres.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    zkConnect: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // Tests run the `fencepost` command as users do, from dist/: build it from the sources under test
  // (FENCEPOST_TEST_SKIP_BUILD=1 when you know dist/ is fresh).
  if (process.env.FENCEPOST_TEST_SKIP_BUILD !== '1') execFileSync('npm', ['run', 'build', '--silent'], { cwd: join(import.meta.dirname, '..', '..'), stdio: 'inherit' });
  let pg: RunningPostgres | undefined;
  let zk: LocalZooKeeper | undefined;
  let pgDir: string | undefined;
  const [databaseUrl, zkConnect] = await Promise.all([
    (async () => {
      if (process.env.DATABASE_URL) return process.env.DATABASE_URL;
      pgDir = mkdtempSync(join(tmpdir(), 'fencepost-test-pg-'));
      chmodSync(pgDir, 0o755); // Postgres runs as the postgres user when we are root
      pg = await startPostgres({
        dataDir: join(pgDir, 'data'),
        // Prepared transactions enabled, so the tests show that no door lets client SQL prepare one.
        postgresFlags: ['-c', 'max_connections=300', '-c', 'max_prepared_transactions=10'],
      });
      return pg.url;
    })(),
    (async () => {
      if (process.env.ZK_CONNECT) return process.env.ZK_CONNECT;
      zk = await LocalZooKeeper.start({ servers: 1, tickTimeMs: 200 });
      return zk.connectString;
    })(),
  ]);
  project.provide('databaseUrl', databaseUrl);
  project.provide('zkConnect', zkConnect);
  return async () => {
    await Promise.all([pg?.stop(), zk?.stop()]);
    if (pgDir) rmSync(pgDir, { recursive: true, force: true });
  };
}
