// HAProxy (Debian's `haproxy`, 2.6) from tools/ha/haproxy.cfg: one TCP listener that forwards to
// the Patroni node whose REST API answers 200 to GET /primary.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { PatroniNodeSpec } from './patroni-node.ts';
import { PortTakenError } from '../../src/ports.ts';
import { portTakenLine } from '../ports.ts';
import { fillTemplate } from './template.ts';

export const HAPROXY_TEMPLATE = join(import.meta.dirname, 'haproxy.cfg');

export class HaProxy {
  readonly port: number;
  private readonly child: ChildProcess;

  private constructor(port: number, child: ChildProcess) {
    this.port = port;
    this.child = child;
  }

  static async start(dir: string, port: number, nodes: readonly PatroniNodeSpec[]): Promise<HaProxy> {
    if (nodes.length !== 3) throw new Error('tools/ha/haproxy.cfg lists three nodes');
    const values: Record<string, string | number> = { LISTEN_PORT: port };
    nodes.forEach((n, i) => {
      values[`NODE${i + 1}_NAME`] = n.name;
      values[`NODE${i + 1}_PG_PORT`] = n.pgPort;
      values[`NODE${i + 1}_REST_PORT`] = n.restPort;
    });
    const cfg = join(dir, 'haproxy.cfg');
    writeFileSync(cfg, fillTemplate(readFileSync(HAPROXY_TEMPLATE, 'utf8'), values));
    const log = createWriteStream(join(dir, 'haproxy.log'));
    // -db: stay in the foreground; the config is checked first (-c) so a bad one fails loudly.
    const checked = spawn('haproxy', ['-c', '-q', '-f', cfg], { stdio: ['ignore', 'pipe', 'pipe'] });
    let checkOut = '';
    checked.stdout?.on('data', (d: Buffer) => (checkOut += d.toString()));
    checked.stderr?.on('data', (d: Buffer) => (checkOut += d.toString()));
    const code = await new Promise<number | null>((r) => checked.once('exit', r));
    if (code !== 0) throw new Error(`haproxy refused ${cfg}:\n${checkOut}`);
    const child = spawn('haproxy', ['-db', '-f', cfg], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const keep = (d: Buffer) => (output += d.toString());
    child.stdout?.pipe(log);
    child.stderr?.pipe(log);
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    // HAProxy binds its listener before it serves, and exits when it cannot (a port taken: PortTakenError).
    const closed = new Promise<true>((r) => child.once('close', () => r(true))); // after its output
    const exited = await Promise.race([closed, sleep(200).then(() => false)]);
    child.stdout?.off('data', keep);
    child.stderr?.off('data', keep);
    if (exited) {
      const taken = portTakenLine(output);
      if (taken !== null) throw new PortTakenError(`haproxy on port ${port}: ${taken}`);
      throw new Error(`haproxy exited with ${child.exitCode} (see ${join(dir, 'haproxy.log')})`);
    }
    return new HaProxy(port, child);
  }

  async stop(): Promise<void> {
    const child = this.child;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
    await exited;
    clearTimeout(timer);
  }
}
