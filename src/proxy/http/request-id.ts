// Request ids: every response carries `X-Request-Id`, and so does every log line of the request
// (pino's `reqId`). A client's own id is kept when it is sane (1–128 of A-Z a-z 0-9 . _ -), so a
// writer can find its request in the proxy's log; anything else gets a fresh UUID, so a header
// cannot forge log lines or grow them without bound.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance } from 'fastify';

export const REQUEST_ID_HEADER = 'x-request-id';

const SANE_ID = /^[A-Za-z0-9._-]{1,128}$/;

/** fastify's `genReqId`: the client's id when sane, else a UUID. */
export function requestId(req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER];
  return typeof given === 'string' && SANE_ID.test(given) ? given : randomUUID();
}

/** Echoes the id on every routed response (errors included); call before any other hook. */
export function registerRequestId(app: FastifyInstance): void {
  app.addHook('onRequest', async (req, reply) => {
    void reply.header(REQUEST_ID_HEADER, req.id);
  });
}
