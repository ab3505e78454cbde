// Tenant A as a process of its own (`node --import tsx tools/cli.ts tenancy-attacker`), as a real
// tenant is: its client-side work (building multi-MB arguments, thousands of requests) then costs
// the harness's process nothing, and only what reaches the proxy and Postgres is shared with B.
// Commands on stdin, one JSON line each; answers on stdout, one JSON line each:
//   {"cmd":"start","names":[…],"aToken":"7","holdMs":3500}  → {"started":[…]} (after A's sessions are up)
//   {"cmd":"stop"}                                         → {"outcomes":{name: AttackOutcome}}
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import pg from 'pg';
import { allAttacks, type AttackOutcome } from './attacks.ts';
import type { Endpoints, Tenants } from './tenants.ts';
import { TOOLS_CLI } from '../cli.ts';

interface Start {
  cmd: 'start';
  names: string[];
  aToken: string;
  holdMs: number;
}

/** The child's side: FENCEPOST_TENANCY_SETUP is JSON `{e, t}` (the environment, not argv: it holds A's secrets). */
export async function attackerCommand(): Promise<number> {
  const { e, t } = JSON.parse(process.env.FENCEPOST_TENANCY_SETUP ?? '{}') as { e: Endpoints; t: Tenants };
  const admin = new pg.Pool({ connectionString: e.adminUrl, max: 1 });
  admin.on('error', () => {});
  const attacks = new Map((await allAttacks(admin, t)).map((a) => [a.name, a]));
  await admin.end();
  let running: { controller: AbortController; names: string[]; done: Promise<AttackOutcome[]> } | null = null;
  const say = (x: unknown) => process.stdout.write(JSON.stringify(x) + '\n');
  for await (const line of createInterface({ input: process.stdin })) {
    const msg = JSON.parse(line) as Start | { cmd: 'stop' };
    if (msg.cmd === 'start') {
      const controller = new AbortController();
      const ctx = { e, t, aToken: BigInt(msg.aToken), holdMs: msg.holdMs, signal: controller.signal };
      const done = Promise.all(
        msg.names.map((n) => {
          const a = attacks.get(n);
          if (a === undefined) return Promise.resolve({ answers: { [`harness: no attack ${n}`]: 1 }, longestRefusalMs: 0 });
          return a.run(ctx).catch((err: unknown) => ({ answers: { [`harness: ${(err as Error).message}`]: 1 }, longestRefusalMs: 0 }));
        }),
      );
      running = { controller, names: msg.names, done };
      say({ started: msg.names });
    } else if (running !== null) {
      running.controller.abort();
      const outcomes = await running.done;
      say({ outcomes: Object.fromEntries(running.names.map((n, i) => [n, outcomes[i]])) });
      running = null;
    }
  }
  return 0;
}

/** The harness's side: a tenant-A process, driven case by case. */
export class AttackerProcess {
  private readonly child: ChildProcess;
  private readonly lines: string[] = [];
  private waiting: ((line: string) => void) | null = null;
  private failed: ((err: Error) => void) | null = null;
  private stderr = '';

  constructor(e: Endpoints, t: Tenants) {
    this.child = spawn(process.execPath, [...TOOLS_CLI, 'tenancy-attacker'], {
      env: { ...process.env, FENCEPOST_TENANCY_SETUP: JSON.stringify({ e, t }) },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.child.stderr!.on('data', (d: Buffer) => (this.stderr += d.toString()));
    this.child.once('exit', (code) => this.failed?.(new Error(`tenancy attacker exited with ${code}: ${this.stderr.slice(-2000)}`)));
    createInterface({ input: this.child.stdout! }).on('line', (l) => {
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = null;
        w(l);
      } else this.lines.push(l);
    });
  }

  private async next(timeoutMs: number): Promise<unknown> {
    const line =
      this.lines.shift() ??
      (await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`tenancy attacker: no answer in ${timeoutMs} ms; stderr: ${this.stderr.slice(-2000)}`)),
          timeoutMs,
        );
        if (this.child.exitCode !== null)
          reject(new Error(`tenancy attacker exited with ${this.child.exitCode}: ${this.stderr.slice(-2000)}`));
        this.failed = (err) => (clearTimeout(timer), reject(err));
        this.waiting = (l) => (clearTimeout(timer), (this.failed = null), resolve(l));
      }));
    return JSON.parse(line);
  }

  async start(names: string[], aToken: bigint, holdMs: number): Promise<void> {
    this.child.stdin!.write(JSON.stringify({ cmd: 'start', names, aToken: String(aToken), holdMs }) + '\n');
    await this.next(60_000);
  }

  async stop(): Promise<Record<string, AttackOutcome>> {
    this.child.stdin!.write(JSON.stringify({ cmd: 'stop' }) + '\n');
    return ((await this.next(60_000)) as { outcomes: Record<string, AttackOutcome> }).outcomes;
  }

  async close(): Promise<void> {
    if (this.child.exitCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }
}
