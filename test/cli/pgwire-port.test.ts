// FENCEPOST_PGWIRE_PORT taken: one line naming that setting, like PORT's, not a raw Node stack;
// 0: a free port (of FENCEPOST_PORT_RANGE when set), named in the listening line.
import { expect, test } from 'vitest';
import { connect, createServer, type Server } from 'node:net';
import { listenError } from '../../src/proxy/startup-errors.ts';
import { oneLineFailure, run } from '../support/cli.ts';
import { createTestDatabase } from '../support/db.ts';
import { spawnProxy } from '../support/proxy.ts';
import { listenFree } from '../../tools/ports.ts';

/** A loopback port held by this process (a free port, of FENCEPOST_PORT_RANGE when set). */
async function occupy(): Promise<{ server: Server; port: number }> {
  const server = createServer();
  return { server, port: await listenFree(server) };
}

test("the SQL endpoint's port in use is refused naming FENCEPOST_PGWIRE_PORT, before Postgres is used", async () => {
  const { server, port: sql } = await occupy();
  try {
    // Nothing listens at DATABASE_URL: the port check comes first, so that is never reached.
    const r = run(['serve'], { PORT: '0', FENCEPOST_PGWIRE_PORT: String(sql), DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x' });
    expect(oneLineFailure(r)).toBe(
      `fencepost: cannot start: FENCEPOST_PGWIRE_PORT: 127.0.0.1:${sql} is already in use (another fencepost serve? set FENCEPOST_PGWIRE_PORT)`,
    );
  } finally {
    server.close();
  }
});

test('a listen of the SQL endpoint that fails after the bind test (taken meanwhile) names FENCEPOST_PGWIRE_PORT too', () => {
  const inUse = Object.assign(new Error('listen EADDRINUSE: address already in use 127.0.0.1:6543'), { code: 'EADDRINUSE' });
  expect(listenError(inUse, '127.0.0.1', 6543, 'FENCEPOST_PGWIRE_PORT')).toMatchObject({
    setting: 'FENCEPOST_PGWIRE_PORT',
    message: 'FENCEPOST_PGWIRE_PORT: 127.0.0.1:6543 is already in use (another fencepost serve? set FENCEPOST_PGWIRE_PORT)',
  });
  const denied = Object.assign(new Error('listen EACCES'), { code: 'EACCES' });
  expect(listenError(denied, '127.0.0.1', 543, 'FENCEPOST_PGWIRE_PORT').message).toBe(
    'FENCEPOST_PGWIRE_PORT: not allowed to listen on 127.0.0.1:543 (ports below 1024 need privileges)',
  );
  expect(listenError(inUse, '127.0.0.1', 8080).setting).toBe('PORT'); // the HTTP door's, as before
});

test('PORT=0 and FENCEPOST_PGWIRE_PORT=0: both doors listen on free ports, which the listening lines name', async () => {
  const db = await createTestDatabase();
  const proxy = await spawnProxy({ DATABASE_URL: db.url, PORT: '0', FENCEPOST_PGWIRE_PORT: '0' });
  try {
    // spawnProxy found both ports in the listening lines; the HTTP one answered /readyz there.
    expect(Number(new URL(proxy.url).port)).toBeGreaterThan(0);
    expect(proxy.pgwirePort).toBeGreaterThan(0);
    expect(proxy.pgwirePort).not.toBe(Number(new URL(proxy.url).port));
    await new Promise<void>((resolve, reject) => {
      const s = connect({ host: '127.0.0.1', port: proxy.pgwirePort! }, () => {
        s.destroy();
        resolve();
      });
      s.once('error', reject);
    });
  } finally {
    expect(await proxy.stop()).toBe(0);
    await db.drop();
  }
});
