// dashboards/: the Grafana dashboard and Prometheus alert rules only use metrics the proxy or
// `fencepost elect --status-port` really expose, and docker-compose.yml runs Prometheus and Grafana
// on those files.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { REPO, testApp } from '../support/proxy.ts';
import { WRITE_OUTCOMES } from '../../src/proxy/metrics.ts';
import { Election } from '../../src/election/election.ts';
import { ElectionMetrics } from '../../src/cli/election-metrics.ts';

let db: TestDatabase;
let app: FastifyInstance;
/** Series names the proxy and elect expose (histograms expanded to _bucket/_sum/_count). */
let exposed: Set<string>;
/** Those of `fencepost elect --status-port` (with --proxy) alone. */
let electionSeries: Set<string>;

const seriesNames = (text: string): string[] => [...text.matchAll(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )/gm)].map((m) => m[1]!);

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  // One write of each outcome, so every labelled series exists.
  await app.inject({ method: 'PUT', url: '/v1/objects/d', headers: { 'fencing-token': '2' }, payload: 'x' });
  await app.inject({ method: 'PUT', url: '/v1/objects/d', headers: { 'fencing-token': '1' }, payload: 'x' });
  const text = (await app.inject({ url: '/metrics' })).body;
  exposed = new Set(seriesNames(text));
  // An election that never connects exposes every series but the token, which exists while leading.
  const election = new Election({ connect: '127.0.0.1:1', path: '/dashboards', id: 'd' });
  electionSeries = new Set([
    ...seriesNames(await new ElectionMetrics(election, { fenceAdvance: true, processMetrics: false }).text()),
    'fencepost_election_token',
  ]);
  for (const name of electionSeries) exposed.add(name);
  // Histograms with no observation yet in this app still exist with these suffixes.
  for (const m of text.matchAll(/^# TYPE (\S+) histogram$/gm)) for (const s of ['_bucket', '_sum', '_count']) exposed.add(m[1]! + s);
});
afterAll(async () => {
  await app.close();
  await db.drop();
});

const OUTCOMES: readonly string[] = WRITE_OUTCOMES;

function metricNames(expr: string): string[] {
  return [...expr.matchAll(/\b((?:fencepost|nodejs|process)_[a-z0-9_]+)\b/g)].map((m) => m[1]!);
}

function checkExpr(where: string, expr: string): void {
  const names = metricNames(expr);
  for (const name of names) expect(exposed, `${where}: ${name}`).toContain(name);
  for (const m of expr.matchAll(/outcome=~?"([^"]+)"/g))
    for (const o of m[1]!.split('|')) expect(OUTCOMES, `${where}: outcome ${o}`).toContain(o);
}

test("every Grafana panel queries the dashboard's Prometheus datasource for metrics the proxy exposes", () => {
  const dash = JSON.parse(readFileSync(join(REPO, 'dashboards', 'grafana.json'), 'utf8')) as {
    uid: string;
    panels: { type: string; title: string; datasource?: { uid: string }; targets?: { expr: string }[] }[];
  };
  const graphs = dash.panels.filter((p) => p.type !== 'row');
  expect(graphs.length).toBeGreaterThanOrEqual(10);
  for (const p of graphs) {
    expect(p.datasource?.uid, p.title).toBe('${DS_PROMETHEUS}');
    expect(p.targets?.length, p.title).toBeGreaterThan(0);
    for (const t of p.targets ?? []) {
      expect(metricNames(t.expr).length, `${p.title}: ${t.expr}`).toBeGreaterThan(0);
      checkExpr(p.title, t.expr);
    }
  }
  // The signals the README tells operators to watch are all on it.
  const all = graphs
    .flatMap((p) => p.targets ?? [])
    .map((t) => t.expr)
    .join('\n');
  for (const name of [
    'fencepost_writes_total',
    'fencepost_write_duration_seconds_bucket',
    'fencepost_db_pool_waiting_requests',
    'fencepost_db_pool_connections',
    'nodejs_eventloop_lag_p99_seconds',
  ]) {
    expect(all).toContain(name);
  }
  // And every election metric of `fencepost elect --status-port`: who leads, the token, changes, failures.
  for (const name of electionSeries) expect(all, name).toContain(name);
});

// Imported through Grafana's UI, `__inputs` asks for a Prometheus datasource and replaces
// ${DS_PROMETHEUS}; provisioned as a file (docker-compose.yml), nothing replaces it, and the
// datasource variable of that name resolves it to the default Prometheus datasource.
test('the Grafana dashboard imports into any Grafana: one datasource input, referenced everywhere, and a variable of the same name', () => {
  const text = readFileSync(join(REPO, 'dashboards', 'grafana.json'), 'utf8');
  const dash = JSON.parse(text) as {
    __inputs: { name: string; type: string; pluginId: string }[];
    templating: { list: { name: string; type: string; query: unknown }[] };
  };
  expect(dash.__inputs).toEqual([expect.objectContaining({ name: 'DS_PROMETHEUS', type: 'datasource', pluginId: 'prometheus' })]);
  expect(dash.templating.list).toContainEqual(expect.objectContaining({ name: 'DS_PROMETHEUS', type: 'datasource', query: 'prometheus' }));
  const uids = [...text.matchAll(/"datasource": \{\s*"type": "([^"]+)",\s*"uid": "([^"]+)"/g)].map((m) => `${m[1]} ${m[2]}`);
  expect(uids.length).toBeGreaterThanOrEqual(10);
  expect(new Set(uids)).toEqual(new Set(['prometheus ${DS_PROMETHEUS}']));
  expect(text.match(/"datasource":/g)?.length).toBe(uids.length);
  const provisioned = readFileSync(join(REPO, 'dashboards', 'grafana', 'provisioning', 'datasources', 'prometheus.yml'), 'utf8');
  expect(provisioned).toMatch(/^\s*type: prometheus$/m);
  expect(provisioned).toMatch(/^\s*isDefault: true$/m);
});

test('the Prometheus alert rules use metrics the proxy or elect expose, and every election metric but the token is alerted on', () => {
  const rules = readFileSync(join(REPO, 'dashboards', 'prometheus-alerts.yml'), 'utf8');
  // One-line exprs, and folded ones (`expr: >-` and the indented lines under it).
  const exprs = [...rules.matchAll(/^(\s*)expr: (?:>-\n((?:\1 {2}.+\n)+)|(.+)$)/gm)].map((m) => (m[2] ?? m[3]!).trim());
  expect(exprs.length).toBeGreaterThanOrEqual(8);
  for (const e of exprs) checkExpr('alert rule', e);
  const used = new Set(exprs.flatMap(metricNames));
  for (const name of [
    'fencepost_election_is_leader',
    'fencepost_election_leadership_changes_total',
    'fencepost_election_fence_advance_failures_total',
  ])
    expect(used, name).toContain(name);
});

test('Prometheus scrapes /metrics of the compose proxy service, and has a job for elect status ports', () => {
  const prom = readFileSync(join(REPO, 'dashboards', 'prometheus.yml'), 'utf8');
  expect(prom).toMatch(/metrics_path: \/metrics/);
  // FencepostElectDown matches this job name.
  expect(prom).toMatch(/^ {2}- job_name: fencepost-elect$/m);
  expect(prom).toContain("targets: ['proxy:8080']");
  // Relative to prometheus.yml, so promtool and docker-compose.yml find it beside it (test/ops/promtool.test.ts).
  expect(prom).toMatch(/^rule_files:\n {2}- prometheus-alerts\.yml$/m);
});

test('docker-compose.yml runs prometheus and grafana with those files mounted', () => {
  const compose = (...args: string[]) =>
    spawnSync('docker-compose', ['-f', join(REPO, 'docker-compose.yml'), ...args], { cwd: REPO, encoding: 'utf8' });
  const services = compose('config', '--services');
  expect(services.error, 'docker-compose is not installed: run scripts/test.sh, which installs it').toBeUndefined();
  expect(services.status, services.stderr).toBe(0);
  expect(services.stdout.trim().split('\n')).toEqual(expect.arrayContaining(['proxy', 'prometheus', 'grafana']));
  const full = compose('config').stdout;
  const mounts = [...full.matchAll(/^\s*- (\/[^:\s]+):(\/[^:\s]+):ro$/gm)].map((m) => ({ host: m[1]!, container: m[2]! }));
  const byContainer = new Map(mounts.map((m) => [m.container, m.host]));
  expect(byContainer.get('/etc/prometheus/prometheus.yml')).toBe(join(REPO, 'dashboards', 'prometheus.yml'));
  expect(byContainer.get('/etc/prometheus/prometheus-alerts.yml')).toBe(join(REPO, 'dashboards', 'prometheus-alerts.yml'));
  expect(byContainer.get('/var/lib/grafana/dashboards/fencepost.json')).toBe(join(REPO, 'dashboards', 'grafana.json'));
  expect(byContainer.get('/etc/grafana/provisioning/datasources')).toBe(join(REPO, 'dashboards', 'grafana', 'provisioning', 'datasources'));
  expect(byContainer.get('/etc/grafana/provisioning/dashboards')).toBe(join(REPO, 'dashboards', 'grafana', 'provisioning', 'dashboards'));
  for (const { host } of mounts) expect(existsSync(host), host).toBe(true);
});
