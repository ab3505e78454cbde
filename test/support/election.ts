// Shared helpers for the election tests: unique paths, polling, event capture, session killing.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import zookeeper from 'node-zookeeper-client';
import { Election } from '../../src/election/election.ts';
import type { ElectionOptions } from '../../src/election/election.ts';
import { ZkSession } from '../../src/election/zk-session.ts';

export const now = (): number => performance.now();

export function uniquePath(name: string): string {
  return `/fencepost-test/${name}-${randomUUID().slice(0, 8)}`;
}

export async function waitFor(pred: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = now() + timeoutMs;
  while (!pred()) {
    if (now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await sleep(10);
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Starts candidates one after another (so their order in the queue is known), or all at once. */
export async function startCandidates(
  n: number,
  base: Omit<ElectionOptions, 'id'>,
  opts: { concurrent?: boolean } = {},
): Promise<Election[]> {
  const es = Array.from({ length: n }, (_, i) => new Election({ ...base, id: `c${i}` }));
  if (opts.concurrent) await Promise.all(es.map((e) => e.start()));
  else for (const e of es) await e.start();
  return es;
}

export function leaders(es: readonly Election[]): Election[] {
  return es.filter((e) => e.isLeader);
}

/**
 * Watches a group of candidates and records every moment (each elected/revoked event, and a 5 ms
 * sampler) at which more than one of them believed it was leader.
 */
export function watchSingleLeader(es: readonly Election[]): { violations: string[]; stop: () => void } {
  const violations: string[] = [];
  const check = (when: string): void => {
    const ls = leaders(es);
    if (ls.length > 1) violations.push(`${when}: ${ls.map((e) => `${e.id}@${e.token}`).join(', ')}`);
  };
  const handlers = es.map((e) => {
    const onElected = ({ token }: { token: bigint }): void => check(`${e.id} elected with ${token}`);
    const onRevoked = ({ token }: { token: bigint }): void => check(`${e.id} revoked ${token}`);
    e.on('elected', onElected);
    e.on('revoked', onRevoked);
    return () => {
      e.off('elected', onElected);
      e.off('revoked', onRevoked);
    };
  });
  const timer = setInterval(() => check('sample'), 5);
  return {
    violations,
    stop: () => {
      clearInterval(timer);
      for (const h of handlers) h();
    },
  };
}

/** Resolves with the first candidate (other than `except`) to be elected, and its token. */
export function nextElected(es: readonly Election[], except?: Election): Promise<{ e: Election; token: bigint; at: number }> {
  return new Promise((resolve) => {
    const offs: Array<() => void> = [];
    for (const e of es) {
      if (e === except) continue;
      const h = ({ token }: { token: bigint }): void => {
        for (const off of offs) off();
        resolve({ e, token, at: now() });
      };
      e.on('elected', h);
      offs.push(() => e.off('elected', h));
    }
  });
}

/**
 * Ends a live session from outside, as an operator or a partition beyond the timeout would: attaches
 * a second connection to the same session and closes it (Curator's KillSession technique). The victim
 * may re-attach first (then the close is refused as "session moved"), so this repeats until the victim
 * reports its session lost.
 */
export async function killSession(connect: string, session: ZkSession): Promise<void> {
  const { id, password } = session.credentials();
  const lost = new Promise<void>((resolve) => session.once('lost', () => resolve()));
  for (let attempt = 0; attempt < 10; attempt++) {
    if (session.state === 'lost') return;
    const client = zookeeper.createClient(connect, {
      sessionId: id,
      sessionPassword: password,
      sessionTimeout: session.negotiatedTimeoutMs,
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('killSession: could not attach to the session')), 10_000);
      client.once('connected', () => {
        clearTimeout(timer);
        client.close();
        resolve();
      });
      client.once('expired', () => {
        clearTimeout(timer);
        client.close();
        resolve();
      });
      client.connect();
    });
    if (await Promise.race([lost.then(() => true), sleep(1000).then(() => false)])) return;
  }
  throw new Error('killSession: the session survived 10 attempts');
}

/**
 * Creates /fencepost-test open to everyone, if it is not there yet. A test whose elections run with
 * credentials calls this first: the parents such an election creates get its ACL, which would shut
 * every other test (other credentials, or none) out of the common parent.
 */
export async function openTestRoot(connect: string): Promise<void> {
  const s = await ZkSession.open({ connect, sessionTimeoutMs: 4000 });
  try {
    await s.mkdirp('/fencepost-test');
  } finally {
    await s.close();
  }
}

/** True while process `pid` runs (a zombie, dead but not yet reaped by its new parent, is not). */
export function processAlive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) [ZX]/s.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

export async function openObserver(connect: string): Promise<ZkSession> {
  return await ZkSession.open({ connect, sessionTimeoutMs: 10_000 });
}

export async function closeAll(es: readonly Election[]): Promise<void> {
  await Promise.all(es.map((e) => e.close()));
}
