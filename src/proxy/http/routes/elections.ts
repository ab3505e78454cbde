// GET /v1/elections — the elections the forgery guard maps (FENCEPOST_FORGERY_GUARD), read from
// ZooKeeper now: who leads each, since when, how many candidates queue, and whether the leader has
// raised its fence yet (the fence with the highest token under the mapped prefix, from the
// database). A leader whose token stays above its fence is one whose advance keeps failing: it
// leads in ZooKeeper but cannot write. Without the guard the proxy knows no election paths and the
// list is empty. The answer is read at most once per ELECTIONS_CACHE_MS, whatever the request rate:
// requests meanwhile (and concurrent ones) share it, so a reader cannot make the proxy hammer
// ZooKeeper and the fence table.
import type { FastifyInstance } from 'fastify';

/** How long one reading of the elections answers every request. */
export const ELECTIONS_CACHE_MS = 1000;

const election = {
  type: 'object',
  properties: {
    electionPath: { type: 'string' },
    fenceKeyPrefix: { type: 'string' },
    candidates: { type: 'integer', description: 'live candidates, the leader among them' },
    leader: {
      type: ['object', 'null'],
      description: 'the trusted lowest candidate; null when nobody leads (or no node is trusted, see untrusted)',
      properties: {
        token: { type: 'string', description: 'its znode sequence: the token that may raise the fences under the prefix' },
        id: {
          type: ['string', 'null'],
          description: 'its name, as it wrote it into its znode (`fencepost elect --id`, `Election` `id`); null when it wrote none',
        },
        joinedAt: { type: 'string', format: 'date-time', description: 'when its znode was created (it queued from then; ZooKeeper time)' },
        seenSince: {
          type: 'string',
          format: 'date-time',
          description:
            "when this proxy instance first saw it lead: at most its leadership's start (ZooKeeper keeps no time of the handover)",
        },
      },
    },
    untrusted: { type: ['string', 'null'], description: 'why no node under this path is trusted to lead' },
    fence: {
      type: ['object', 'null'],
      description: 'the fence with the highest token under the prefix; null when none exists yet',
      properties: {
        fenceKey: { type: 'string' },
        highestToken: { type: 'string' },
        raisedBy: { type: ['string', 'null'] },
        raisedAt: { type: 'string', format: 'date-time' },
      },
    },
    fenceRaised: { type: ['boolean', 'null'], description: "the fence is at the leader's token (or above it); null when nobody leads" },
  },
};

export async function electionRoutes(app: FastifyInstance): Promise<void> {
  let cached: { at: number; reading: Promise<{ guard: true; elections: unknown[] }> } | null = null;
  async function read(): Promise<{ guard: true; elections: unknown[] }> {
    const guard = app.forgeryGuard!;
    const views = await guard.elections();
    const elections = await Promise.all(
      views.map(async (v) => {
        const fence = await app.fence.leadingFence(v.fenceKeyPrefix);
        return {
          electionPath: v.electionPath,
          fenceKeyPrefix: v.fenceKeyPrefix,
          candidates: v.candidates,
          leader: v.leader && {
            token: v.leader.token.toString(),
            id: v.leader.id,
            joinedAt: v.leader.joinedAt.toISOString(),
            seenSince: v.leader.seenSince.toISOString(),
          },
          untrusted: v.untrusted,
          fence: fence && {
            fenceKey: fence.fenceKey,
            highestToken: fence.highestToken.toString(),
            raisedBy: fence.raisedBy,
            raisedAt: fence.raisedAt.toISOString(),
          },
          fenceRaised: v.leader === null ? null : fence !== null && fence.highestToken >= v.leader.token,
        };
      }),
    );
    return { guard: true, elections };
  }

  app.get(
    '/v1/elections',
    {
      config: { access: 'read' },
      schema: {
        summary: 'The elections the forgery guard maps: leader, since when, candidates, and whether the leader has raised its fence',
        querystring: { type: 'object', additionalProperties: false, properties: {} },
        response: {
          200: {
            type: 'object',
            properties: {
              guard: { type: 'boolean', description: 'false: FENCEPOST_FORGERY_GUARD is not set, so no election paths are known' },
              elections: { type: 'array', items: election },
            },
          },
        },
      },
    },
    async () => {
      const guard = app.forgeryGuard;
      if (guard === null) return { guard: false, elections: [] };
      const now = Date.now();
      if (cached === null || now - cached.at >= ELECTIONS_CACHE_MS) {
        const reading = read();
        cached = { at: now, reading };
        // A failed reading is not kept: the next request reads again.
        reading.catch(() => {
          if (cached?.reading === reading) cached = null;
        });
      }
      return await cached.reading;
    },
  );
}
