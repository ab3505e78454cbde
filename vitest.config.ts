import { defineConfig } from 'vitest/config';

/**
 * Whole-system runs, tens of seconds to minutes of processes each: the chaos runs (a three-server
 * ZooKeeper ensemble, proxies, writers, a nemesis), the seeded protocol fuzzers, the demos and the
 * elected writer end to end, the etcd integration, clusters of their own (a synchronous standby
 * stalled, embedded clusters side by side), the release tarball installed into a clean
 * folder, and the docs' command blocks (each page against a `fencepost serve` of its own). Project
 * `system` (`npm run test:system`; scripts/test.sh runs it after `npm test`);
 * `npm test` runs project `unit`, everything else. A file named on the command line runs whichever
 * it is in.
 */
const SYSTEM_TESTS = [
  'test/chaos/chaos-run.test.ts',
  'test/chaos/broken-fence.test.ts',
  'test/chaos/cluster.test.ts',
  'test/proxy/sql/fuzz.test.ts',
  'test/ops/durability-fuzz.test.ts',
  'test/writer/demo.test.ts',
  'test/writer/demo-transaction.test.ts',
  'test/writer/elected-transaction.test.ts',
  'test/integrations/etcd.test.ts',
  'test/proxy/commit-unknown-sync.test.ts',
  'test/fence/raise-durability.test.ts',
  'test/fence/embedded-postgres.test.ts',
  'test/package.test.ts',
  'test/docs.test.ts',
  'test/orms/orms.test.ts',
];

export default defineConfig({
  test: {
    globalSetup: ['test/support/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // expect.poll waits for what another process or a background statement does: on a loaded
    // 2-core box that can take more than the default second (a poll ends as soon as it holds).
    expect: { poll: { timeout: 10_000 } },
    // Files share one Postgres and one ZooKeeper; each file gets its own database / election paths.
    fileParallelism: true,
    maxWorkers: 2,
    pool: 'forks',
    projects: [
      { extends: true, test: { name: 'unit', include: ['test/**/*.test.ts'], exclude: SYSTEM_TESTS } },
      { extends: true, test: { name: 'system', include: SYSTEM_TESTS } },
    ],
  },
});
