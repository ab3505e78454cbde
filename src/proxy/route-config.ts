// What a route may declare in its fastify `config`, read by app-wide hooks:
//   operation: marks a fenced write route; the metrics hook (metrics.ts) counts it by outcome.
//   access:    the access level the authentication hook enforces ('open' needs no credentials).
// Declared in one place so every route and hook agree on the names and values.
import type { OpKind } from '../fence/queries.ts';

export type RouteAccess = 'read' | 'write' | 'open';

declare module 'fastify' {
  interface FastifyContextConfig {
    operation?: OpKind;
    access?: RouteAccess;
  }
}
