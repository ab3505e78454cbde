import type { FastifyRequest } from 'fastify';
import { ApiError } from '../../errors.ts';

/** The 409 for a write below the fence; `highestToken` is the fence as read after the rejection. */
export function staleToken(req: FastifyRequest, fenceKey: string, token: bigint, highestToken: bigint): ApiError {
  // Summed per interval, not a line each (src/logging/stale-digest.ts).
  req.server.staleLog.note(
    { door: req.routeOptions.config.operation === 'transaction' ? 'transaction' : 'http', fenceKey, token, highestToken },
    req.log,
  );
  return new ApiError('stale_token', `token ${token} is below the fence's highest token ${highestToken}`, {
    fenceKey,
    token: token.toString(),
    highestToken: highestToken.toString(),
  });
}
