// Election over a real 3-server ZooKeeper ensemble that loses servers.
import { afterAll, beforeAll, expect, test } from 'vitest';
import { LocalZooKeeper } from '../../src/demo/local-zookeeper.ts';
import type { Election } from '../../src/election/election.ts';
import { closeAll, leaders, startCandidates, uniquePath, waitFor, watchSingleLeader } from '../support/election.ts';

let zk: LocalZooKeeper;
beforeAll(async () => {
  zk = await LocalZooKeeper.start({ servers: 3, tickTimeMs: 200 });
}, 120_000);
afterAll(async () => {
  await zk?.stop();
});

function serverIdOf(e: Election): number {
  const addr = e.currentSession?.serverAddress;
  const port = addr ? Number(addr.split(':')[1]) : NaN;
  const node = zk.nodes.find((n) => n.clientPort === port);
  if (!node) throw new Error(`${e.id} is not connected to a known server (${addr})`);
  return node.id;
}

const allSettled = (es: readonly Election[]): boolean =>
  leaders(es).length === 1 && es.every((e) => e.currentSession?.state === 'connected' && e.nodePath !== null);

test('3-server ensemble losing the server the leader is connected to, then the quorum leader: still exactly one leader', async () => {
  // Invariant: at no observed moment do two candidates lead, and after each server loss the group
  // settles on exactly one leader again (tokens rising) without any server coming back first.
  const path = uniquePath('ensemble');
  const es = await startCandidates(3, { connect: zk.connectString, path, sessionTimeoutMs: 4000 });
  const watch = watchSingleLeader(es);
  try {
    await waitFor(() => allSettled(es), 10_000, 'initial leader');
    const first = leaders(es)[0]!;
    const t1 = first.token!;

    // 1. Kill the server the leader is connected to.
    const victim = serverIdOf(first);
    await zk.stopNode(victim, 'SIGKILL');
    await waitFor(() => allSettled(es) && es.every((e) => serverIdOf(e) !== victim), 20_000, 'settled after losing the leader’s server');
    const t2 = leaders(es)[0]!.token!;
    expect(t2 > t1).toBe(true);

    // 2. Bring it back, then kill the ensemble's own (quorum) leader: every session is disconnected.
    await zk.startNode(victim);
    let quorumLeader = 0;
    for (const n of zk.nodes) if ((await zk.mode(n.id)) === 'leader') quorumLeader = n.id;
    expect(quorumLeader).toBeGreaterThan(0);
    let suspensions = 0;
    for (const e of es) e.on('connection', ({ state }) => state === 'suspended' && suspensions++);
    await zk.stopNode(quorumLeader, 'SIGKILL');
    // Followers without a leader stop serving and drop their clients: every session is disturbed.
    await waitFor(() => suspensions >= es.length, 20_000, 'every session suspended by the quorum loss');
    await waitFor(
      () => allSettled(es) && es.every((e) => serverIdOf(e) !== quorumLeader),
      30_000,
      'settled after losing the quorum leader',
    );
    expect(leaders(es)[0]!.token! > t2).toBe(true); // the leader was suspended too, so its term ended
    expect(es.every((e) => e.stats.sessions === 1)).toBe(true); // sessions survived: no expiry needed
    expect(watch.violations).toEqual([]);
  } finally {
    watch.stop();
    await closeAll(es);
  }
}, 90_000);
