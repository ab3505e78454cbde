// HTTP object and fence writes through app.inject() (open mode), and an object as Postgres holds it.
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import type { TestDatabase } from './db.ts';

/** PUT /v1/objects/:key with a token and, when given, a Fence-Key (default: the object's own key). */
export const putObject = (
  app: FastifyInstance,
  key: string,
  token: string | number,
  body: string,
  fenceKey?: string,
): Promise<LightMyRequestResponse> =>
  app.inject({
    method: 'PUT',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'content-type': 'text/plain', 'fencing-token': String(token), ...(fenceKey === undefined ? {} : { 'fence-key': fenceKey }) },
    payload: body,
  });

export const deleteObject = (
  app: FastifyInstance,
  key: string,
  token: string | number,
  fenceKey?: string,
): Promise<LightMyRequestResponse> =>
  app.inject({
    method: 'DELETE',
    url: `/v1/objects/${encodeURIComponent(key)}`,
    headers: { 'fencing-token': String(token), ...(fenceKey === undefined ? {} : { 'fence-key': fenceKey }) },
  });

/** PUT /v1/fences/:fenceKey: raises the fence to `token` (or leaves it where it is). */
export const raiseFence = (app: FastifyInstance, fenceKey: string, token: string | number): Promise<LightMyRequestResponse> =>
  app.inject({ method: 'PUT', url: `/v1/fences/${encodeURIComponent(fenceKey)}`, headers: { 'fencing-token': String(token) } });

/** The object row (fence key, token, version, body as text), or null. */
export async function storedObject(
  db: TestDatabase,
  key: string,
): Promise<{ fence_key: string; token: string; version: string; body: string } | null> {
  const { rows } = await db.pool.query<{ fence_key: string; token: string; version: string; body: string }>(
    `SELECT fence_key, token::text, version::text, convert_from(body, 'UTF8') AS body FROM fencepost.objects WHERE key = $1`,
    [key],
  );
  return rows[0] ?? null;
}
