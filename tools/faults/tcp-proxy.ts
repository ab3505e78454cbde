// A loopback TCP proxy that injects network faults between a client and one server.
//
// Modes, switchable at any time:
// - forward:   bytes flow both ways.
// - blackhole: open connections stay open but nothing is delivered in either direction, and new
//              connections are accepted and held silent, like a partition where packets are dropped
//              (the peers see a half-open connection: if one side closes, the other is not told).
//              Reading is paused rather than data dropped, so `forward()` heals the partition like TCP
//              retransmission would (a side that closed meanwhile is then reset).
// - refuse:    new connections are closed at once (the server looks down); open ones are unaffected.
// `cut()` closes all open connections immediately (both peers see the connection end).
// `loseReplyAfter(match)`: the next client chunk that `match`es is delivered to the server, but the
// server's reply to it is not: the connection is cut first (a request that ran, whose reply was lost).
import { createServer, connect as tcpConnect } from 'node:net';
import type { Server, Socket } from 'node:net';
import { listenFree } from '../ports.ts';

export type ProxyMode = 'forward' | 'blackhole' | 'refuse';

export interface TcpProxyOptions {
  targetHost?: string;
  targetPort: number;
  /** Port to listen on (127.0.0.1); 0 or omitted picks a free one (of FENCEPOST_PORT_RANGE when set). */
  listenPort?: number;
}

interface Pair {
  client: Socket;
  server: Socket;
  /** A request went through; its reply must be lost (loseReplyAfter). */
  loseNextReply: boolean;
  /** One side closed while blackholed: the other side must not hear of it until the network heals. */
  broken: boolean;
}

export class TcpProxy {
  private readonly server: Server;
  private readonly targetHost: string;
  private readonly targetPort: number;
  private readonly pairs = new Set<Pair>();
  private modeValue: ProxyMode = 'forward';
  private acceptedCount = 0;
  private replyLoss: ((clientChunk: Buffer) => boolean) | null = null;

  private constructor(server: Server, opts: TcpProxyOptions) {
    this.server = server;
    this.targetHost = opts.targetHost ?? '127.0.0.1';
    this.targetPort = opts.targetPort;
    server.on('connection', (sock) => this.onConnection(sock));
  }

  static async start(opts: TcpProxyOptions): Promise<TcpProxy> {
    const server = createServer();
    const proxy = new TcpProxy(server, opts);
    if (!opts.listenPort) await listenFree(server);
    else
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(opts.listenPort, '127.0.0.1', () => {
          server.off('error', reject);
          resolve();
        });
      });
    return proxy;
  }

  get port(): number {
    const addr = this.server.address();
    if (!addr || typeof addr === 'string') throw new Error('proxy not listening');
    return addr.port;
  }
  /** `127.0.0.1:<port>`, usable in a ZooKeeper connect string. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }
  get mode(): ProxyMode {
    return this.modeValue;
  }
  /** Connections currently open through the proxy. */
  get openConnections(): number {
    return this.pairs.size;
  }
  /** Connections accepted since start. */
  get accepted(): number {
    return this.acceptedCount;
  }

  forward(): void {
    this.modeValue = 'forward';
    for (const p of [...this.pairs]) {
      if (p.broken) {
        this.destroyPair(p); // the healed network delivers the close (as an RST)
        continue;
      }
      p.client.resume();
      p.server.resume();
    }
  }

  blackhole(): void {
    this.modeValue = 'blackhole';
    for (const p of this.pairs) {
      p.client.pause();
      p.server.pause();
    }
  }

  refuse(): void {
    this.modeValue = 'refuse';
  }

  /** Arms a one-shot reply loss: see the header. */
  loseReplyAfter(match: (clientChunk: Buffer) => boolean): void {
    this.replyLoss = match;
  }

  /** Closes every open connection (with RST where possible). Mode is unchanged. */
  cut(): void {
    for (const p of [...this.pairs]) this.destroyPair(p);
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private onConnection(client: Socket): void {
    this.acceptedCount++;
    if (this.modeValue === 'refuse') {
      client.destroy();
      return;
    }
    const server = tcpConnect({ host: this.targetHost, port: this.targetPort });
    const pair: Pair = { client, server, broken: false, loseNextReply: false };
    this.pairs.add(pair);
    client.setNoDelay(true);
    server.setNoDelay(true);
    client.on('data', (chunk: Buffer) => {
      if (this.replyLoss?.(chunk)) {
        this.replyLoss = null;
        pair.loseNextReply = true;
      }
    });
    server.prependListener('data', () => {
      if (pair.loseNextReply) this.destroyPair(pair);
    });
    this.pipe(client, server);
    this.pipe(server, client, pair);
    const end = (): void => {
      // A FIN or RST is a packet too: while blackholed, the peer of a closed side hears nothing.
      if (this.modeValue === 'blackhole') pair.broken = true;
      else this.destroyPair(pair);
    };
    client.on('close', end);
    server.on('close', end);
    client.on('error', end);
    server.on('error', end);
    if (this.modeValue === 'blackhole') {
      client.pause();
      server.pause();
    }
  }

  private pipe(from: Socket, to: Socket, replies?: Pair): void {
    from.on('data', (chunk: Buffer) => {
      if (replies?.loseNextReply || to.destroyed) return;
      if (!to.write(chunk)) {
        from.pause();
        to.once('drain', () => {
          if (this.modeValue !== 'blackhole') from.resume();
        });
      }
    });
  }

  private destroyPair(p: Pair): void {
    if (!this.pairs.delete(p)) return;
    if (typeof p.client.resetAndDestroy === 'function' && !p.client.destroyed) p.client.resetAndDestroy();
    else p.client.destroy();
    p.server.destroy();
  }
}
