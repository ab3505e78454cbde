// A proxy's pass hint (src/fence/store.ts fencedStrategy) is only a guess at which statement to run:
// once a fence key's writes passed at token T through a proxy, its next plain puts at T go through
// the leaner fencedPuts first. A fence raised meanwhile by another proxy or door must still make
// those puts stale: fencedPuts applies a put only while the fence is at its very token, and leaves
// the rest to fencedWrite, which rejects it.
import { expect } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { fencedPuts, fencedWrite } from '../../src/fence/sql/objects.ts';
import { twoProxiesTest } from '../support/fixtures.ts';
import { putObject, raiseFence, storedObject } from '../support/objects.ts';

const FENCED_PUTS = fencedPuts([]).name;
const FENCED_WRITE = fencedWrite([]).name;

// Proxy A records its statements; proxy B has a store (and so hints) of its own.
const test = twoProxiesTest;

const RAISES: [string, (b: FastifyInstance, fenceKey: string, token: number) => Promise<{ statusCode: number; body: string }>][] = [
  ['PUT /v1/fences through proxy B', (b, fenceKey, token) => raiseFence(b, fenceKey, token)],
  [
    'a PUT of another object at the new token through proxy B',
    (b, fenceKey, token) => putObject(b, `${fenceKey}/other`, token, 'raise', fenceKey),
  ],
  [
    'POST /v1/transactions through proxy B',
    (b, fenceKey, token) =>
      b.inject({
        method: 'POST',
        url: '/v1/transactions',
        headers: { 'content-type': 'application/json' },
        payload: { fences: [{ key: fenceKey, token: String(token) }], statements: [{ sql: 'SELECT 1' }] },
      }),
  ],
];

for (const [how, raise] of RAISES) {
  test(`a put at token T through a proxy whose hint says T passed is stale after ${how} raised the fence to T+1`, async ({
    db,
    proxies: { a, b, statementsOfA },
  }) => {
    // Invariant: no write of a token below the fence is accepted, whatever a proxy last saw pass.
    const fenceKey = `hint/${how.replace(/[^a-z0-9]+/gi, '-')}`;
    const key = `${fenceKey}/1`;
    const T = 7;
    // Warm A's hint: the first put at T is decided by fencedWrite, the next by fencedPuts.
    statementsOfA.length = 0;
    expect((await putObject(a, key, T, 'first at T', fenceKey)).statusCode).toBe(200);
    expect((await putObject(a, key, T, 'second at T', fenceKey)).statusCode).toBe(200);
    expect(statementsOfA, 'the second put at T took the hinted statement').toEqual([FENCED_WRITE, FENCED_PUTS]);

    const raised = await raise(b, fenceKey, T + 1);
    expect(raised.statusCode, raised.body).toBe(200);

    statementsOfA.length = 0;
    const stale = await putObject(a, key, T, 'third at T, after the raise', fenceKey);
    expect(statementsOfA[0], 'A still trusted its hint: the put went to fencedPuts first').toBe(FENCED_PUTS);
    expect(stale.statusCode, stale.body).toBe(409);
    expect(stale.json()).toMatchObject({ error: 'stale_token', fenceKey, token: String(T), highestToken: String(T + 1) });
    expect(await storedObject(db, key)).toEqual({ fence_key: fenceKey, token: String(T), version: '2', body: 'second at T' });
  });
}
