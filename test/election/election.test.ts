// Leader election against the run's real ZooKeeper (standalone, tickTime 200 ms).
import { randomUUID } from 'node:crypto';
import { afterEach, expect, inject, test } from 'vitest';
import zookeeper from 'node-zookeeper-client';
import { Election } from '../../src/election/election.ts';
import { SequenceOverflowError } from '../../src/election/errors.ts';
import { sortCandidates } from '../../src/election/sequence.ts';
import type { ZkSession } from '../../src/election/zk-session.ts';
import { TcpProxy } from '../../tools/faults/tcp-proxy.ts';
import {
  killSession,
  leaders,
  nextElected,
  now,
  openObserver,
  sleep,
  startCandidates,
  uniquePath,
  waitFor,
  watchSingleLeader,
} from '../support/election.ts';

const connect = inject('zkConnect');
const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function track<T extends Election | ZkSession | TcpProxy>(x: T): T {
  cleanups.push(() => x.close());
  return x;
}

test('ten candidates on separate sessions: exactly one leader at every observed moment, always the lowest sequence', async () => {
  // Invariant: while candidates join concurrently and then hand over 24 times, no two candidates
  // believe they lead at once, and the one leading holds the lowest live sequence number.
  const path = uniquePath('ten');
  const observer = track(await openObserver(connect));
  const es = await startCandidates(10, { connect, path, sessionTimeoutMs: 4000 }, { concurrent: true });
  es.forEach(track);
  const watch = watchSingleLeader(es);
  cleanups.push(watch.stop);

  const assertLowestLeads = async (): Promise<Election> => {
    await waitFor(() => leaders(es).length === 1 && es.every((e) => e.nodePath !== null), 5000, 'one leader, all joined');
    const [leader] = leaders(es);
    const { children } = await observer.getChildren(path);
    const lowest = sortCandidates(children)[0];
    expect(children).toHaveLength(10);
    expect(leader!.token).toBe(BigInt(lowest!.seq));
    expect(leader!.nodePath).toBe(`${path}/${lowest!.name}`);
    expect(await es[3]!.leader()).toEqual({ id: leader!.id, token: leader!.token });
    return leader!;
  };

  let leader = await assertLowestLeads();
  for (let round = 0; round < 24; round++) {
    const next = nextElected(es, leader);
    await leader.resign();
    await next;
    leader = await assertLowestLeads();
  }
  expect(watch.violations).toEqual([]);
});

test('tokens strictly rise over 25 consecutive elections on one path (resigns and crashes)', async () => {
  // Invariant: every new term on a path carries a token greater than every earlier term's, whether the
  // previous leader resigned or crashed (session abandoned, handed over only after session expiry).
  const path = uniquePath('monotonic');
  const base = { connect, path, sessionTimeoutMs: 2000 };
  const es = await startCandidates(3, base);
  es.forEach(track);
  const tokens: bigint[] = [];
  const record = (e: Election): void => void e.on('elected', ({ token }) => tokens.push(token));
  es.forEach(record);
  tokens.push(await es[0]!.waitForLeadership());
  let crashes = 0;
  for (let round = 1; round <= 24; round++) {
    const leader = leaders(es)[0]!;
    const next = nextElected(es, leader);
    if (round % 8 === 0) {
      leader.currentSession!.abandon(); // like SIGKILL: the node stays until the session expires
      es.splice(es.indexOf(leader), 1);
      crashes++;
      const replacement = track(new Election({ ...base, id: `r${round}` }));
      record(replacement);
      await replacement.start();
      es.push(replacement);
    } else {
      await leader.resign();
    }
    await next;
  }
  expect(crashes).toBe(3);
  expect(tokens.length).toBe(25);
  for (let i = 1; i < tokens.length; i++) expect(tokens[i]! > tokens[i - 1]!).toBe(true);
});

test('a single candidate that resigns is re-elected at once with a greater token', async () => {
  // Invariant: resign() ends the term (signal aborted, 'revoked' resigned) and the rejoin is a new term.
  const e = track(new Election({ connect, path: uniquePath('solo'), sessionTimeoutMs: 4000 }));
  await e.start();
  const t1 = await e.waitForLeadership();
  const signal = e.signal;
  const revoked: string[] = [];
  e.on('revoked', ({ reason }) => revoked.push(reason));
  await e.resign();
  expect(signal.aborted).toBe(true);
  expect(revoked).toEqual(['resigned']);
  const t2 = await e.waitForLeadership();
  expect(t2 > t1).toBe(true);
});

test('a leader whose process stalls past the session timeout has its signal aborted before any timer of its own runs', async () => {
  // Invariant: after a pause longer than the lease (a GC pause, SIGSTOP), leadership is in doubt at
  // once: the first thing the process can observe is an aborted signal, not a live term.
  const e = track(new Election({ connect, path: uniquePath('stall'), sessionTimeoutMs: 2000 }));
  await e.start();
  await e.waitForLeadership();
  const signal = e.signal;
  const until = Date.now() + 2600;
  while (Date.now() < until); // a synchronous stall: no timer, no I/O
  // Timers that expired during the stall run first; this one was scheduled after them.
  const seen = await new Promise<boolean>((r) => setTimeout(() => r(signal.aborted), 0));
  expect(seen).toBe(true);
});

test('herd: when the leader leaves, only its immediate successor is woken', async () => {
  // Invariant: each candidate watches only its predecessor, so one departure = one watch notification.
  const path = uniquePath('herd');
  const es = await startCandidates(10, { connect, path, sessionTimeoutMs: 4000 });
  es.forEach(track);
  const leader = es[0]!;
  await leader.waitForLeadership();
  const before = es.map((e) => e.stats.watchNotifications);
  const next = nextElected(es, leader);
  await leader.resign();
  const { e: successor } = await next;
  await sleep(500); // let any stray notification arrive
  const woken = es.filter((e, i) => e.stats.watchNotifications > before[i]!);
  expect(successor).toBe(es[1]);
  expect(woken).toEqual([es[1]]);
  expect(es[1]!.stats.watchNotifications - before[1]!).toBe(1);
});

test('protected create: a create whose reply was lost is found again, not duplicated', async () => {
  // Invariant: after a dropped create reply the candidate owns exactly one node, created by that
  // create on the server, and leads with that node's sequence as its token. The reply is lost on
  // the wire: the create reaches ZooKeeper, the connection is cut before its answer comes back.
  const path = uniquePath('lost-reply');
  const [host, port] = connect.split(',')[0]!.split(':');
  const net = await TcpProxy.start({ targetHost: host, targetPort: Number(port) });
  const candidatePrefix = Buffer.from(`${path}/c_`);
  net.loseReplyAfter((chunk) => chunk.includes(candidatePrefix));
  const states: string[] = [];
  const e = track(new Election({ connect: net.address, path, sessionTimeoutMs: 4000 }));
  try {
    e.on('connection', ({ state }) => states.push(state));
    await e.start();
    const token = await e.waitForLeadership();
    const observer = track(await openObserver(connect));
    const { children } = await observer.getChildren(path);
    expect(children).toHaveLength(1);
    expect(children[0]).toContain(e.uuid);
    expect(token).toBe(BigInt(sortCandidates(children)[0]!.seq));
    expect(token).toBe(0n); // the first and only create under this path
    expect(states).toEqual(['connected', 'suspended', 'reconnected']); // the reply really was lost
    expect(e.stats.sessions).toBe(1);
  } finally {
    await e.close();
    await net.close();
  }
});

test('protected create: a node of ours left by an older, still-live session is deleted, not adopted', async () => {
  // Invariant: a restarted candidate (same uuid) never leads through a node its current session does
  // not own; it deletes the leftover and so takes over without waiting for the old session to expire.
  const path = uniquePath('stale-node');
  const uuid = randomUUID();
  const crashed = track(new Election({ connect, path, id: 'before-crash', sessionTimeoutMs: 30_000, __test__uuid: uuid }));
  await crashed.start();
  const oldToken = await crashed.waitForLeadership();
  const oldNode = crashed.nodePath!;
  crashed.currentSession!.abandon(); // like SIGKILL: the server keeps the session for 30 s

  const restarted = track(new Election({ connect, path, id: 'after-restart', sessionTimeoutMs: 4000, __test__uuid: uuid }));
  await restarted.start();
  // Well before the old session's 30 s timeout: only deleting the leftover makes this possible.
  const newToken = await restarted.waitForLeadership(AbortSignal.timeout(10_000));
  const observer = track(await openObserver(connect));
  expect(await observer.exists(oldNode)).toBeNull();
  expect(newToken > oldToken).toBe(true);
  const own = await observer.exists(restarted.nodePath!);
  expect(own!.ephemeralOwner.toString('hex')).toBe(restarted.currentSession!.sessionId);
});

test('session expiry reported by the server: the leader is revoked and rejoins with a new session, node and token', async () => {
  // Invariant: after its session expires, the candidate never leads through the old session; it
  // rejoins through a new session and its next term's token is greater.
  const path = uniquePath('expiry');
  const e = track(new Election({ connect, path, sessionTimeoutMs: 2000 }));
  await e.start();
  const t1 = await e.waitForLeadership();
  const firstSession = e.currentSession!.sessionId;
  const revoked: string[] = [];
  const lost: string[] = [];
  e.on('revoked', ({ reason }) => revoked.push(reason));
  e.on('connection', ({ state, reason }) => state === 'lost' && lost.push(reason ?? '?'));
  await killSession(connect, e.currentSession!);
  await waitFor(() => e.stats.sessions === 2 && e.isLeader, 10_000, 're-elected on a new session');
  expect(revoked[0]).toMatch(/^(suspended|lost)$/);
  expect(lost).toEqual(['expired']);
  expect(e.currentSession!.sessionId).not.toBe(firstSession);
  expect(e.token! > t1).toBe(true);
});

test('connection blackholed between the leader and ZooKeeper: signal aborts before the session timeout, then lost, then a new leader', async () => {
  // Invariants: the cut-off leader's signal fires before its session can expire (and so before anyone
  // else is elected); it then reports the session lost; the other candidate takes over with a greater token.
  const path = uniquePath('blackhole');
  const zkPort = Number(connect.split(',')[0]!.split(':')[1]);
  const proxy = track(await TcpProxy.start({ targetPort: zkPort }));
  const a = track(new Election({ connect: proxy.address, path, id: 'a', sessionTimeoutMs: 3000 }));
  await a.start();
  const aToken = await a.waitForLeadership();
  const b = track(new Election({ connect, path, id: 'b', sessionTimeoutMs: 3000 }));
  await b.start();
  const T = a.currentSession!.negotiatedTimeoutMs;
  expect(T).toBe(3000);

  let abortedAt = 0;
  let lostAt = 0;
  a.signal.addEventListener('abort', () => (abortedAt = now()));
  a.on('connection', ({ state }) => state === 'lost' && lostAt === 0 && (lostAt = now()));
  const bElected = nextElected([b]);
  const cutAt = now();
  proxy.blackhole();
  const { token: bToken, at: bElectedAt } = await bElected;
  await waitFor(() => lostAt > 0, 5000, 'a reports its session lost');

  expect(abortedAt).toBeGreaterThan(0);
  expect(abortedAt - cutAt).toBeLessThan(T);
  expect(abortedAt).toBeLessThan(bElectedAt);
  expect(lostAt).toBeGreaterThan(abortedAt);
  expect(bToken > aToken).toBe(true);
  expect(a.isLeader).toBe(false);

  proxy.forward(); // the partition heals: a rejoins behind b on a new session
  await waitFor(() => a.stats.sessions === 2 && a.nodePath !== null, 10_000, 'a rejoined');
  expect(leaders([a, b])).toEqual([b]);
});

test('policy wait-for-expiry keeps the term (same token, signal live) through a brief disconnection', async () => {
  // Invariant: with wait-for-expiry a disconnection shorter than the session timeout does not end the term.
  const zkPort = Number(connect.split(',')[0]!.split(':')[1]);
  const proxy = track(await TcpProxy.start({ targetPort: zkPort }));
  const e = track(new Election({ connect: proxy.address, path: uniquePath('wait'), sessionTimeoutMs: 3000, policy: 'wait-for-expiry' }));
  await e.start();
  const token = await e.waitForLeadership();
  const signal = e.signal;
  const states: string[] = [];
  e.on('connection', ({ state }) => states.push(state));
  const revoked: string[] = [];
  e.on('revoked', ({ reason }) => revoked.push(reason));
  proxy.cut();
  await waitFor(() => states.includes('reconnected'), 5000, 'reconnected');
  await sleep(200);
  expect(states).toEqual(['suspended', 'reconnected']);
  expect(revoked).toEqual([]);
  expect(signal.aborted).toBe(false);
  expect(e.token).toBe(token);
});

test('policy suspend-is-lost ends the term on disconnection and starts a new term with a new token', async () => {
  // Invariant: with the default policy the term ends the moment the connection drops, even if it comes
  // straight back; leading again requires a new node and so a greater token.
  const zkPort = Number(connect.split(',')[0]!.split(':')[1]);
  const proxy = track(await TcpProxy.start({ targetPort: zkPort }));
  const e = track(new Election({ connect: proxy.address, path: uniquePath('suspend'), sessionTimeoutMs: 3000 }));
  await e.start();
  const token = await e.waitForLeadership();
  const signal = e.signal;
  const revoked: string[] = [];
  e.on('revoked', ({ reason }) => revoked.push(reason));
  proxy.cut();
  expect(signal.aborted).toBe(false); // the client notices the close asynchronously
  await waitFor(() => signal.aborted, 5000, 'term aborted');
  expect(revoked).toEqual(['suspended']);
  const next = await e.waitForLeadership();
  expect(next > token).toBe(true);
  expect(e.stats.sessions).toBe(1); // same session: the old node was deleted and a new one created
});

test('a wrapped (negative) sequence number stops the election loudly instead of electing by it', async () => {
  // Invariant: a candidate never leads when the parent's int32 sequence counter has wrapped.
  const path = uniquePath('overflow');
  const observer = track(await openObserver(connect));
  await observer.mkdirp(path);
  // What ZooKeeper appends after 2^31 creates: "%010d" of a negative int32.
  await observer.create(`${path}/c_${randomUUID()}_1--000000005`, null, zookeeper.CreateMode.EPHEMERAL);
  const e = track(new Election({ connect, path, sessionTimeoutMs: 4000 }));
  const errors: Error[] = [];
  e.on('error', (err) => errors.push(err));
  await expect(e.start()).rejects.toBeInstanceOf(SequenceOverflowError);
  expect(errors[0]).toBeInstanceOf(SequenceOverflowError);
  expect(e.isLeader).toBe(false);
  await expect(e.waitForLeadership()).rejects.toBeInstanceOf(SequenceOverflowError);
});

test('runWhileLeader runs fn only during a term and aborts its signal when the term ends', async () => {
  // Invariant: fn starts only while its candidate leads (never alongside another leader), with that
  // term's token, and its signal aborts when the term ends.
  const path = uniquePath('run');
  const [a, b] = await startCandidates(2, { connect, path, sessionTimeoutMs: 4000 });
  track(a!);
  track(b!);
  const aToken = await a!.waitForLeadership();
  let startedWith: { token: bigint; bLeads: boolean; aLeads: boolean } | null = null;
  const run = b!.runWhileLeader(async (signal, token) => {
    startedWith = { token, bLeads: b!.isLeader, aLeads: a!.isLeader };
    await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
    return token;
  });
  await sleep(200);
  expect(startedWith).toBeNull();
  await a!.resign();
  await waitFor(() => startedWith !== null, 5000, 'fn started');
  expect(startedWith!.bLeads).toBe(true);
  expect(startedWith!.aLeads).toBe(false);
  expect(startedWith!.token > aToken).toBe(true);
  await b!.resign();
  expect(await run).toBe(startedWith!.token);
});

test('close() while leading revokes with reason closed and hands over at once', async () => {
  // Invariant: closing ends the term before the session is closed, and the next candidate is elected
  // without waiting for a session timeout.
  const path = uniquePath('close');
  const [a, b] = await startCandidates(2, { connect, path, sessionTimeoutMs: 30_000 });
  track(b!);
  await a!.waitForLeadership();
  const reasons: string[] = [];
  a!.on('revoked', ({ reason }) => reasons.push(reason));
  const next = nextElected([b!]);
  const t0 = now();
  await a!.close();
  await next;
  expect(reasons).toEqual(['closed']);
  expect(now() - t0).toBeLessThan(30_000); // the 30 s session timeout did not have to pass
  await expect(a!.waitForLeadership()).rejects.toThrow(/closed/);
});

test('policy wait-for-expiry: a partition longer than the session timeout revokes with reason lost, then another candidate leads', async () => {
  // Invariant: wait-for-expiry keeps the term only while the session may still be alive; once the
  // client's own clock says it may have expired, the term ends ('lost') and the other candidate leads.
  const path = uniquePath('wait-lost');
  const zkPort = Number(connect.split(',')[0]!.split(':')[1]);
  const proxy = track(await TcpProxy.start({ targetPort: zkPort }));
  const a = track(new Election({ connect: proxy.address, path, id: 'a', sessionTimeoutMs: 2000, policy: 'wait-for-expiry' }));
  await a.start();
  const aToken = await a.waitForLeadership();
  const b = track(new Election({ connect, path, id: 'b', sessionTimeoutMs: 2000 }));
  await b.start();
  const reasons: string[] = [];
  a.on('revoked', ({ reason }) => reasons.push(reason));
  const bElected = nextElected([b]);
  proxy.blackhole();
  await waitFor(() => a.currentSession?.state !== 'connected', 5000, 'a notices the dead connection');
  expect(a.isLeader).toBe(true); // suspended, but the session may still be alive: term kept
  const { token: bToken } = await bElected;
  await waitFor(() => reasons.length > 0, 5000, 'a revoked');
  expect(reasons).toEqual(['lost']);
  expect(bToken > aToken).toBe(true);
});
