// What a route may declare in its fastify `config`, read by app-wide hooks:
//   operation: marks a fenced write route; the metrics hook (metrics.ts) counts it by outcome.
//   (Every reply also carries `errorCode`, set by the error handler, so outcomes follow the registry.)
//   access:    the access level the authentication hook enforces ('open' needs no credentials).
// Declared in one place so every route and hook agree on the names and values.
import type { OpKind } from '../../fence/index.ts';

export type RouteAccess = 'read' | 'write' | 'open';

declare module 'fastify' {
  interface FastifyReply {
    /** The registry code of an error answer, null for a success. */
    errorCode: string | null;
  }
  interface FastifyContextConfig {
    operation?: OpKind | 'transaction';
    access?: RouteAccess;
  }
}
