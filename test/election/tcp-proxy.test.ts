// The fault-injecting TCP proxy against a real echo server.
import { createServer, connect as tcpConnect } from 'node:net';
import type { Server, Socket } from 'node:net';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { TcpProxy } from '../../tools/faults/tcp-proxy.ts';
import { listenFree } from '../../tools/ports.ts';
import { sleep, waitFor } from '../support/election.ts';

let echo: Server;
let echoPort = 0;
beforeAll(async () => {
  echo = createServer((s) => s.pipe(s));
  echoPort = await listenFree(echo);
});
afterAll(() => new Promise<void>((r) => echo.close(() => r())));

function client(port: number): { sock: Socket; received: () => string; closed: () => boolean } {
  const sock = tcpConnect({ host: '127.0.0.1', port });
  let data = '';
  let closed = false;
  sock.on('data', (d) => (data += d.toString()));
  sock.on('close', () => (closed = true));
  sock.on('error', () => {});
  return { sock, received: () => data, closed: () => closed };
}

test('blackhole holds bytes without closing the connection; forward delivers them afterwards', async () => {
  // Invariant: a blackholed connection is silent but open (half-open to both peers), and healing it
  // delivers what was sent meanwhile, like TCP retransmission after a partition.
  const proxy = await TcpProxy.start({ targetPort: echoPort });
  try {
    const c = client(proxy.port);
    c.sock.write('a');
    await waitFor(() => c.received() === 'a', 2000, 'echo through the proxy');
    proxy.blackhole();
    c.sock.write('b');
    await sleep(200);
    expect(c.received()).toBe('a');
    expect(c.closed()).toBe(false);
    proxy.forward();
    await waitFor(() => c.received() === 'ab', 2000, 'held bytes delivered');
    c.sock.destroy();
  } finally {
    await proxy.close();
  }
});

test('cut closes open connections; refuse closes new ones at once', async () => {
  // Invariant: cut() ends every open connection; in refuse mode no new connection carries data.
  const proxy = await TcpProxy.start({ targetPort: echoPort });
  try {
    const c = client(proxy.port);
    c.sock.write('x');
    await waitFor(() => c.received() === 'x', 2000, 'echo');
    proxy.cut();
    await waitFor(() => c.closed(), 2000, 'connection closed by cut');
    proxy.refuse();
    const d = client(proxy.port);
    d.sock.write('y');
    await waitFor(() => d.closed(), 2000, 'new connection refused');
    expect(d.received()).toBe('');
    expect(proxy.openConnections).toBe(0);
  } finally {
    await proxy.close();
  }
});
