// Process metrics (CPU, memory, event loop, GC, handles) for every fencepost process that serves
// /metrics: the proxy (proxy/metrics.ts) and `fencepost elect --status-port` (cli/election-metrics.ts).
// They describe the process, not an app, and prom-client's collectors install observers that
// cannot be removed: collected once per process on a registry of their own, merged into each
// registry's output at scrape time.
import { Registry, collectDefaultMetrics } from 'prom-client';

let processRegistry: Registry | null = null;

export function processMetrics(): Registry {
  if (processRegistry === null) {
    processRegistry = new Registry();
    collectDefaultMetrics({ register: processRegistry });
    // Gauges named `_total` (the sums of nodejs_active_handles, _requests and _resources by type,
    // which stay): `promtool check metrics` refuses them, since `_total` names a counter.
    for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'])
      processRegistry.removeSingleMetric(name);
  }
  return processRegistry;
}
