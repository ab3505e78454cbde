// One real Postgres and one real ZooKeeper for the whole run; DATABASE_URL / ZK_CONNECT reuse existing ones.
import type { TestProject } from 'vitest/node';
import { chmodSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import type { RunningPostgres } from '../../src/fence/embedded-postgres.ts';
import { LocalZooKeeper } from '../../src/demo/local-zookeeper.ts';
import { portRange } from '../../src/ports.ts';
import { startPostgres } from '../../tools/postgres.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    zkConnect: string;
  }
}

/** The newest modification time of `path`, a file or every file below a folder; 0 when absent. */
function newest(path: string): number {
  let st;
  try {
    st = statSync(path);
  } catch {
    return 0;
  }
  if (!st.isDirectory()) return st.mtimeMs;
  return readdirSync(path).reduce((m, name) => Math.max(m, newest(join(path, name))), st.mtimeMs);
}

/** dist/ was built after every input of `npm run build` last changed. */
function distIsFresh(root: string): boolean {
  const built = newest(join(root, 'dist', 'cli', 'main.js'));
  const inputs = ['src', 'types', 'package.json', 'tsconfig.json', 'tsconfig.build.json', 'scripts/copy-assets.mjs'].map((p) =>
    newest(join(root, p)),
  );
  return built > 0 && built >= Math.max(...inputs);
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // Tests run the `fencepost` command as users do, from dist/: build it from the sources under test,
  // unless it is newer than all of them (npm ci has just built it; FENCEPOST_TEST_SKIP_BUILD=1
  // skips the check too).
  portRange(); // FENCEPOST_PORT_RANGE: a bad value stops the run here, naming the variable
  const root = join(import.meta.dirname, '..', '..');
  if (process.env.FENCEPOST_TEST_SKIP_BUILD !== '1' && !distIsFresh(root))
    execFileSync('npm', ['run', 'build', '--silent'], { cwd: root, stdio: 'inherit' });
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
        // Commit timestamps, so a test can check commit order (shared-lock.test.ts).
        postgresFlags: ['-c', 'max_connections=300', '-c', 'max_prepared_transactions=10', '-c', 'track_commit_timestamp=on'],
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
