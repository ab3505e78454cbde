// Fencing tokens from etcd's lock (docs/integrations.md), with the page's own writer scripts and
// `etcdctl lock` commands, against a real etcd and a real proxy (both doors). Holder A writes,
// is paused (SIGSTOP) past its lease; holder B gets the lock at a higher revision and writes; A
// resumes, is refused and steps down.
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect } from 'vitest';
import { sqlTest } from '../support/fixtures.ts';
import { REPO } from '../support/proxy.ts';
import { fenceRow } from '../support/sql.ts';
import { etcdInstalled, startEtcd, type LocalEtcd } from '../support/etcd.ts';

const missing = etcdInstalled();
if (missing !== null) console.warn(`${missing}: skipping the etcd lock tests`);

const test = sqlTest
  .extend('clientTables', { scope: 'file' }, [
    { definition: 'public.orders_summary (id int PRIMARY KEY, written_by text NOT NULL)', privileges: 'SELECT, INSERT, UPDATE' },
  ])
  // eslint-disable-next-line no-empty-pattern
  .extend('writers', { scope: 'file' }, async ({}, { onCleanup }): Promise<string> => {
    // The page's writer scripts, in the folder the lock commands run them from (./orders-writer.sh).
    const dir = mkdtempSync(join(tmpdir(), 'fencepost-etcd-writers-'));
    onCleanup(() => rmSync(dir, { recursive: true, force: true }));
    for (const script of ['orders-writer.sh', 'orders-writer-sql.sh']) {
      writeFileSync(join(dir, script), pageBlock(script));
      chmodSync(join(dir, script), 0o755);
    }
    return dir;
  })
  // eslint-disable-next-line no-empty-pattern
  .extend('etcd', { scope: 'file' }, async ({}, { onCleanup }): Promise<LocalEtcd> => {
    if (missing !== null) throw new Error(missing);
    const etcd = await startEtcd();
    onCleanup(() => etcd.stop());
    return etcd;
  });

const PAGE = readFileSync(join(REPO, 'docs', 'integrations.md'), 'utf8');

/** The code block the page marks `<!-- run by test/integrations/etcd.test.ts: <name> -->`, as written. */
function pageBlock(name: string): string {
  const marker = `<!-- run by test/integrations/etcd.test.ts: ${name} -->\n`;
  const at = PAGE.indexOf(marker);
  if (at === -1) throw new Error(`docs/integrations.md marks no block "${name}"`);
  const block = /^```[a-z]*\n([\s\S]*?)^```$/m.exec(PAGE.slice(at + marker.length));
  if (block?.index !== 0) throw new Error(`docs/integrations.md: no code block right after "${marker.trim()}"`);
  return block[1]!;
}

/** The processes of group `pgid` still running (zombies left out), from /proc. */
function groupMembers(pgid: number): number[] {
  const members: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      // Fields after the command (in parentheses, which may hold spaces): state, ppid, pgrp, …
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(pgrp) === pgid && state !== 'Z') members.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return members;
}

interface Holder {
  /** Sends a signal to the holder's whole process group: the shell, etcdctl, the writer, its curl or psql. */
  signal(sig: NodeJS.Signals): void;
  /** Resolves once no process of the group is left (etcdctl outlives the shell that started it when both get a SIGTERM). */
  gone(): Promise<void>;
  output(): string;
}

const groups: number[] = [];

/** Runs the page's lock command for writer `name` in `dir`, in a process group of its own. */
function holder(dir: string, command: string, name: string, env: Record<string, string>): Holder {
  const child = spawn('sh', ['-c', command], {
    cwd: dir,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env, WRITER: name },
  });
  const pgid = child.pid!;
  groups.push(pgid);
  let out = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return {
    signal: (sig) => process.kill(-pgid, sig),
    gone: async () => {
      await exited;
      while (groupMembers(pgid).length > 0) await new Promise((r) => setTimeout(r, 50));
    },
    output: () => out,
  };
}

afterEach(() => {
  for (const pgid of groups.splice(0)) {
    if (groupMembers(pgid).length === 0) continue;
    try {
      process.kill(-pgid, 'SIGCONT');
      process.kill(-pgid, 'SIGKILL');
    } catch {
      // the group is gone
    }
  }
});

/** Stops a holder as an operator would (SIGTERM to its group): etcdctl releases the lock once its command has ended. */
async function stopHolder(h: Holder): Promise<void> {
  h.signal('SIGTERM');
  await h.gone();
}

/** Polls `read` until it returns a value `accept` takes; returns that value. */
async function until<T>(read: () => Promise<T>, accept: (v: T) => boolean, what: string, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (accept(v)) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

test.skipIf(missing !== null)(
  "HTTP: a holder paused past its etcd lease is refused once the next holder (higher ETCD_LOCK_REV) wrote; the value and the fence stay the new holder's",
  async ({ etcd, sql, writers }) => {
    const url = sql.proxy.url;
    const command = pageBlock('etcd lock, HTTP');
    const env = { ETCDCTL_ENDPOINTS: etcd.endpoint, FENCEPOST: url };
    const summary = async () => {
      const res = await fetch(`${url}/v1/objects/orders/summary`);
      return res.ok ? { body: await res.text(), token: res.headers.get('fencing-token') ?? '' } : { body: '', token: '' };
    };

    const a = holder(writers, command, 'a', env);
    const byA = await until(summary, (s) => s.body.startsWith('written by a '), "A's first write");
    const tokenA = BigInt(byA.token);
    expect(byA.body).toBe(`written by a with token ${tokenA}`);
    const b = holder(writers, command, 'b', env); // waits for the lock

    a.signal('SIGSTOP'); // etcdctl stops renewing A's lease; its writer stops mid-loop
    const byB = await until(summary, (s) => s.body.startsWith('written by b '), "B's first write, after A's lease expired");
    const tokenB = BigInt(byB.token);
    expect(tokenB).toBeGreaterThan(tokenA);

    a.signal('SIGCONT'); // A's writer carries on as if it still held the lock
    await a.gone();
    expect(a.output()).toContain(`a: token ${tokenA} is stale: stepping down: {"error":"stale_token"`); // the proxy's answer, printed

    // Invariant: the value is B's, the fence at B's revision; A's refusal is in the rejection log.
    const after = await summary();
    expect(after).toEqual({ body: `written by b with token ${tokenB}`, token: String(tokenB) });
    const fence = (await (await fetch(`${url}/v1/fences/orders-summary`)).json()) as { highestToken: string };
    expect(fence.highestToken).toBe(String(tokenB));
    const { rejections } = (await (await fetch(`${url}/v1/rejections?fenceKey=orders-summary`)).json()) as {
      rejections: { token: string; highestToken: string; door: string }[];
    };
    expect(rejections).toContainEqual(expect.objectContaining({ token: String(tokenA), highestToken: String(tokenB), door: 'http' }));
    await stopHolder(b);
  },
);

test.skipIf(missing !== null)(
  "SQL endpoint: a holder paused past its etcd lease gets FP409 once the next holder (higher ETCD_LOCK_REV) wrote; the row and the fence stay the new holder's",
  async ({ etcd, sql, db, writers }) => {
    const command = pageBlock('etcd lock, SQL');
    const env = (name: string) => ({ ETCDCTL_ENDPOINTS: etcd.endpoint, FENCEPOST_SQL: sql.url(`writer-${name}`) });
    const row = async () =>
      (await db.pool.query<{ written_by: string }>('SELECT written_by FROM public.orders_summary WHERE id = 1')).rows[0]?.written_by ?? '';
    const tokenOf = (writtenBy: string) => BigInt(/ with token (\d+)$/.exec(writtenBy)![1]!);

    const a = holder(writers, command, 'a', env('a'));
    const tokenA = tokenOf(await until(row, (w) => w.startsWith('a with token '), "A's first write"));
    const b = holder(writers, command, 'b', env('b'));

    a.signal('SIGSTOP');
    const tokenB = tokenOf(await until(row, (w) => w.startsWith('b with token '), "B's first write, after A's lease expired"));
    expect(tokenB).toBeGreaterThan(tokenA);

    a.signal('SIGCONT');
    await a.gone();
    expect(a.output()).toContain(`a: token ${tokenA} is stale: stepping down`);

    // Invariant: the row is B's, the fence at B's revision; A's refusal is in the rejection log.
    expect(await row()).toBe(`b with token ${tokenB}`);
    expect((await fenceRow(db.pool, 'orders-summary'))?.highest_token).toBe(String(tokenB));
    // The SQL endpoint records a refusal after answering it.
    const rejections = async () =>
      (
        (await (await fetch(`${sql.proxy.url}/v1/rejections?fenceKey=orders-summary`)).json()) as {
          rejections: { token: string; highestToken: string; door: string }[];
        }
      ).rejections;
    await expect
      .poll(rejections)
      .toContainEqual(expect.objectContaining({ token: String(tokenA), highestToken: String(tokenB), door: 'sql' }));
    await stopHolder(b);
  },
);
