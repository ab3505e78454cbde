// Election znodes nobody else can forge: with digest credentials, the election path, the parents a
// candidate creates and every candidate node get the election ACL (the identity may do anything,
// everyone else may read), against the run's real ZooKeeper. A second client, without credentials
// or with other ones, tries to plant a candidate with a low sequence and to delete the leader's node.
import { randomUUID } from 'node:crypto';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterEach, beforeAll, expect, inject, test } from 'vitest';
import zookeeper from 'node-zookeeper-client';
import { Election } from '../../src/election/election.ts';
import { ElectionAccessError, ZK_CODES, ZkError } from '../../src/election/errors.ts';
import { ZkSession } from '../../src/election/zk-session.ts';
import { digestId, electionAcl, type DigestAuth } from '../../src/election/acl.ts';
import { openTestRoot, uniquePath } from '../support/election.ts';

const connect = inject('zkConnect');
const AUTH: DigestAuth = { user: 'elector', password: `pw-${randomUUID()}` };
const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function track<T extends Election | ZkSession>(x: T): T {
  cleanups.push(() => x.close());
  return x;
}

beforeAll(() => openTestRoot(connect));

async function session(auth?: DigestAuth): Promise<ZkSession> {
  return track(await ZkSession.open({ connect, sessionTimeoutMs: 4000, ...(auth ? { auth } : {}) }));
}

async function refusal(p: Promise<unknown>): Promise<number | 'accepted'> {
  try {
    await p;
    return 'accepted';
  } catch (err) {
    if (err instanceof ZkError) return err.code;
    throw err;
  }
}

test('with credentials, the election path, the parents it creates and each candidate get the election ACL; without, they stay open', async () => {
  const root = uniquePath('acl');
  const path = `${root}/orders/writer`;
  const a = track(new Election({ connect, path, id: 'a', sessionTimeoutMs: 4000, auth: AUTH }));
  await a.start();
  await a.waitForLeadership();
  // ZooKeeper shows a digest in full only to a session that may administer the node: others see
  // `user:x` (so the forgery guard reads with the elections' credentials).
  const owner = await session(AUTH);
  const anyone = await session();
  const expected = electionAcl(digestId(AUTH));
  for (const p of [root, `${root}/orders`, path, a.nodePath!]) {
    const { acl, stat } = await owner.getAcl(p);
    expect(acl, p).toEqual(expected);
    expect(stat.aversion, p).toBe(0);
    expect((await anyone.getAcl(p)).acl, p).toEqual([{ ...expected[0], id: 'elector:x' }, expected[1]]);
  }
  // Existing parents keep their ACL (/fencepost-test, made open by openTestRoot).
  expect((await anyone.getAcl('/fencepost-test')).acl).toEqual([{ perms: 31, scheme: 'world', id: 'anyone' }]);

  const open = track(new Election({ connect, path: uniquePath('acl-open'), id: 'o', sessionTimeoutMs: 4000 }));
  await open.start();
  await open.waitForLeadership();
  expect((await anyone.getAcl(open.nodePath!)).acl).toEqual([{ perms: 31, scheme: 'world', id: 'anyone' }]);
});

test("a client without the credentials, or with other ones, can neither plant a low-sequence candidate nor delete the leader's node (NoAuth)", async () => {
  const path = uniquePath('acl-forge');
  const a = track(new Election({ connect, path, id: 'a', sessionTimeoutMs: 4000, auth: AUTH }));
  await a.start();
  const token = await a.waitForLeadership();
  const leaderNode = a.nodePath!;
  const planted = `${path}/c_${randomUUID()}_1-0000000000`; // sorts before every real candidate

  for (const forger of [
    await session(),
    await session({ user: 'elector', password: 'wrong' }),
    await session({ user: 'mallory', password: 'x' }),
  ]) {
    expect(await refusal(forger.create(planted, Buffer.from('{"id":"forged"}'), zookeeper.CreateMode.EPHEMERAL))).toBe(ZK_CODES.NO_AUTH);
    expect(await refusal(forger.create(`${path}/c_${randomUUID()}_1-`, null, zookeeper.CreateMode.EPHEMERAL_SEQUENTIAL))).toBe(
      ZK_CODES.NO_AUTH,
    );
    expect(await refusal(forger.remove(leaderNode))).toBe(ZK_CODES.NO_AUTH);
    expect(await refusal(forger.getData(leaderNode))).toBe('accepted'); // everyone may read
  }
  // Nor can a client without credentials open the path up again.
  const raw = await refusal(
    new Promise<void>((resolve, reject) => {
      const c = zookeeper.createClient(connect);
      c.once('connected', () =>
        c.setACL(path, [new zookeeper.ACL(31, new zookeeper.Id('world', 'anyone'))], -1, (e) => {
          c.close();
          if (e) reject(new ZkError('setACL', path, e.getCode(), e.message));
          else resolve();
        }),
      );
      c.connect();
    }),
  );
  expect(raw).toBe(ZK_CODES.NO_AUTH);
  expect(a.isLeader).toBe(true);
  expect(a.token).toBe(token);
  expect(await a.leader()).toEqual({ id: 'a', token });
  expect((await (await session()).getChildren(path)).children).toEqual([leaderNode.slice(path.length + 1)]);
});

test('a candidate with credentials on a path that others can write (created without them) says so at start', async () => {
  const path = uniquePath('acl-preexisting');
  await (await session()).mkdirp(path); // open, as made before ZK_AUTH
  const logs: Array<{ level: number; msg: string; acl?: string }> = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean))
        logs.push(JSON.parse(line) as { level: number; msg: string; acl?: string });
      done();
    },
  });
  const a = track(new Election({ connect, path, id: 'a', sessionTimeoutMs: 4000, auth: AUTH, logger: pino(sink) }));
  await a.start();
  await a.waitForLeadership(); // it still runs: the path is usable, only not protected
  const warning = logs.find(
    (l) => l.level === 50 && l.msg.startsWith('the election path exists with an ACL that lets others create or delete candidates'),
  );
  expect(warning?.acl).toBe('world:anyone:cdrwa');
  expect(JSON.stringify(logs)).not.toContain(AUTH.password);
});

test('a candidate whose credentials the path does not admit stops with ElectionAccessError instead of retrying forever', async () => {
  const path = uniquePath('acl-other');
  const a = track(new Election({ connect, path, id: 'a', sessionTimeoutMs: 4000, auth: AUTH }));
  await a.start();
  await a.waitForLeadership();
  const intruder = track(new Election({ connect, path, id: 'm', sessionTimeoutMs: 4000, auth: { user: 'mallory', password: 'x' } }));
  await expect(intruder.start()).rejects.toBeInstanceOf(ElectionAccessError);
  const noCredentials = track(new Election({ connect, path, id: 'n', sessionTimeoutMs: 4000 }));
  await expect(noCredentials.start()).rejects.toThrow(/NoAuth.*--zk-auth/);
  expect(a.isLeader).toBe(true);
});
