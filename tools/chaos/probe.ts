// The zombie probe, once the writers have stopped: for each fence key whose fence a newer leader
// raised (its highest token above 0), one write per door (PUT, POST /v1/transactions, the SQL
// endpoint) at the token just below it, as a paused ex-leader would send it, recorded in the
// history like any write. The checker then holds it to the invariants (none may land; each 409
// counts in /v1/stats). The load's own zombies come and go with timing (on a loaded box the
// elections shift, and a paused leader may be killed before it writes again); these do not.
import { join } from 'node:path';
import pg from 'pg';
import { DOORS, HistoryRecorder } from './history.ts';
import { RecordingProxyClient } from './recording-client.ts';

export interface ProbeTarget {
  databaseUrl: string;
  proxyUrls: readonly string[];
  pgwireUrls: readonly string[];
  historyDir: string;
}

/** Sends the probes; returns how many were sent. */
export async function probeStaleWrites(c: ProbeTarget, fenceKeys: readonly string[], timeoutMs: number): Promise<number> {
  const db = new pg.Client({ connectionString: c.databaseUrl });
  await db.connect();
  let highest: Map<string, bigint>;
  try {
    const { rows } = await db.query<{ fence_key: string; highest_token: string }>(
      'SELECT fence_key, highest_token::text AS highest_token FROM fencepost.fences WHERE fence_key = ANY($1::text[])',
      [fenceKeys],
    );
    highest = new Map(rows.map((r) => [r.fence_key, BigInt(r.highest_token)]));
  } finally {
    await db.end();
  }
  const recorder = new HistoryRecorder(join(c.historyDir, 'probe.jsonl'), 'probe');
  let sent = 0;
  for (const fenceKey of fenceKeys) {
    const h = highest.get(fenceKey);
    if (h === undefined || h < 1n) continue;
    for (const door of DOORS) {
      const client = new RecordingProxyClient(c.proxyUrls, { writerId: 'probe', timeoutMs }, recorder, () => false, {
        door,
        pgwireUrls: c.pgwireUrls,
      });
      try {
        await client.put(`${fenceKey}/probe-${door}`, JSON.stringify({ probe: door, token: String(h - 1n) }), { token: h - 1n, fenceKey });
      } catch {
        // Recorded in the history with its outcome: the checker and the caller read it there.
      } finally {
        await client.close();
      }
      sent++;
    }
  }
  return sent;
}
