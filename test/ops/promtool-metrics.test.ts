// `promtool check metrics` accepts the proxy's /metrics as served, with every door's series and the
// process metrics in it (prom-client's default `nodejs_active_handles_total` and the like are
// gauges named `_total`, which promtool refuses: metrics.ts leaves them out). promtool comes with
// Debian's `prometheus` package, which scripts/setup.sh --test installs.
import { spawnSync } from 'node:child_process';
import { expect } from 'vitest';
import { sqlTest as test } from '../support/fixtures.ts';
import { fenceOptions } from '../support/sql.ts';

const installed = spawnSync('promtool', ['--version'], { encoding: 'utf8' }).error === undefined;
if (!installed)
  console.warn('promtool is not installed (scripts/setup.sh --test, or apt-get install prometheus): skipping promtool check metrics');

test.skipIf(!installed)("promtool check metrics: the proxy's /metrics passes, after writes at every door", async ({ sql }) => {
  const url = sql.proxy.url;
  expect((await fetch(`${url}/v1/objects/lint/1`, { method: 'PUT', headers: { 'fencing-token': '2' }, body: 'x' })).status).toBe(200);
  expect((await fetch(`${url}/v1/objects/lint/1`, { method: 'PUT', headers: { 'fencing-token': '1' }, body: 'x' })).status).toBe(409);
  const c = await sql.connect('lint', { options: fenceOptions(1, 'lint/sql') });
  await c.query('SELECT 1');
  await c.end();
  const res = await fetch(`${url}/metrics`);
  expect(res.status).toBe(200);
  const text = await res.text();
  expect(text).toContain('fencepost_writes_total{door="sql",operation="transaction",outcome="accepted"} 1');
  expect(text).toContain('nodejs_active_handles{');
  const run = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 60_000 });
  expect(run.status, `${run.stdout}${run.stderr}`).toBe(0);
});
