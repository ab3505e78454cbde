import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
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
  },
});
