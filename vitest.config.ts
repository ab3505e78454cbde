import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Files share one Postgres and one ZooKeeper; each file gets its own database / election paths.
    fileParallelism: true,
    maxWorkers: 2,
    pool: 'forks',
  },
});
