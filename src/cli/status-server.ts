// `fencepost elect --status-port <n>`: who leads, for load balancers and Kubernetes probes.
//   GET /healthz  200 while this `fencepost elect` runs (503 once it is stopping): a liveness probe.
//   GET /leader   200 {"id","token","electionPath"} while this replica leads and its command runs,
//                 503 {"leader":false,…} otherwise: a readiness probe, or a load balancer's check,
//                 sends traffic to the leader only.
//   GET /metrics  Prometheus exposition of this candidate (election-metrics.ts).
// Plain node:http (the election side loads no web framework). Read-only; tokens are not secrets.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { listenInRange, type PortRange } from '../ports.ts';

export interface StatusSource {
  electionPath: string;
  id: string;
  /** The token of the term whose command runs now, or null. */
  leadingToken(): bigint | null;
  /** ZooKeeper session state, for /healthz. */
  zookeeper(): string;
  stopping(): boolean;
  /** GET /metrics. */
  metrics: { readonly contentType: string; text(): Promise<string> };
}

export interface StatusServer {
  port: number;
  close(): Promise<void>;
}

/** Listens on `port`; 0: a free port, one of `range`'s (FENCEPOST_PORT_RANGE) when set. */
export async function startStatusServer(host: string, port: number, range: PortRange | null, source: StatusSource): Promise<StatusServer> {
  const server: Server = createServer((req, res) => {
    const send = (status: number, body: unknown): void => {
      res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : JSON.stringify(body) + '\n');
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, { error: 'method_not_allowed' });
    const path = (req.url ?? '/').split('?')[0];
    const token = source.leadingToken();
    const base = { id: source.id, electionPath: source.electionPath };
    if (path === '/healthz') {
      const stopping = source.stopping();
      return send(stopping ? 503 : 200, {
        status: stopping ? 'stopping' : 'ok',
        ...base,
        leader: token !== null,
        zookeeper: source.zookeeper(),
      });
    }
    if (path === '/metrics') {
      source.metrics.text().then(
        (text) => {
          res.writeHead(200, { 'content-type': source.metrics.contentType, 'cache-control': 'no-store' });
          res.end(req.method === 'HEAD' ? undefined : text);
        },
        () => send(500, { error: 'metrics_failed' }),
      );
      return;
    }
    if (path === '/leader') {
      return token === null ? send(503, { leader: false, ...base }) : send(200, { leader: true, ...base, token: token.toString() });
    }
    send(404, { error: 'not_found' });
  });
  server.keepAliveTimeout = 5000;
  await listenInRange(
    port,
    range,
    (p) =>
      new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(p, host, () => {
          server.off('error', reject);
          resolve();
        });
      }),
  );
  server.unref(); // never what keeps elect running
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
