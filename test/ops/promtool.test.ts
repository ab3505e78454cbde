// The Prometheus files under dashboards/ pass Prometheus's own checker as shipped: the scrape config
// (with its rule file), the alert rules, and a unit test of each alert (dashboards/
// prometheus-alerts.test.yml). promtool comes with Debian's `prometheus` package, which
// scripts/setup.sh --test installs.
import { expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO } from '../support/proxy.ts';

function promtool(...args: string[]): { status: number | null; output: string } {
  const run = spawnSync('promtool', args, { cwd: REPO, encoding: 'utf8', timeout: 60_000 });
  expect(run.error, 'promtool is not installed: run scripts/setup.sh --test (apt-get install prometheus)').toBeUndefined();
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

test('promtool check config: dashboards/prometheus.yml is valid as shipped, its rule file found beside it', () => {
  const run = promtool('check', 'config', 'dashboards/prometheus.yml');
  expect(run.status, run.output).toBe(0);
  expect(run.output).toMatch(/SUCCESS: 1 rule files found/);
});

test('promtool check rules: the alert rules are valid', () => {
  const run = promtool('check', 'rules', 'dashboards/prometheus-alerts.yml');
  expect(run.status, run.output).toBe(0);
});

test('promtool test rules: every alert has a unit test that sees it fire, and all pass', () => {
  const rules = readFileSync(join(REPO, 'dashboards', 'prometheus-alerts.yml'), 'utf8');
  const tests = readFileSync(join(REPO, 'dashboards', 'prometheus-alerts.test.yml'), 'utf8');
  const alerts = [...rules.matchAll(/^\s*- alert: (\w+)$/gm)].map((m) => m[1]!);
  expect(alerts.length).toBeGreaterThanOrEqual(5);
  const firing = new Set([...tests.matchAll(/alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels/g)].map((m) => m[1]!));
  expect(alerts.filter((a) => !firing.has(a))).toEqual([]);
  const run = promtool('test', 'rules', 'dashboards/prometheus-alerts.test.yml');
  expect(run.status, run.output).toBe(0);
  expect(run.output).toMatch(/SUCCESS/);
});
