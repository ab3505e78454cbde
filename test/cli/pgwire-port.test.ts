// FENCEPOST_PGWIRE_PORT taken: one line naming that setting, like PORT's, not a raw Node stack.
import { expect, test } from 'vitest';
import { createServer, type Server } from 'node:net';
import { freePort } from '../../tools/zookeeper/local-server.ts';
import { listenError } from '../../src/proxy/startup-errors.ts';
import { oneLineFailure, run } from '../support/cli.ts';

function occupy(port: number): Promise<Server> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen({ host: '127.0.0.1', port }, () => resolve(s));
  });
}

test('the SQL endpoint\'s port in use is refused naming FENCEPOST_PGWIRE_PORT, before Postgres is used', async () => {
  const [http, sql] = [await freePort(), await freePort()];
  const server = await occupy(sql);
  try {
    // Nothing listens at DATABASE_URL: the port check comes first, so that is never reached.
    const r = run(['serve'], { PORT: String(http), FENCEPOST_PGWIRE_PORT: String(sql), DATABASE_URL: 'postgres://u:p@127.0.0.1:1/x' });
    expect(oneLineFailure(r)).toBe(`fencepost: cannot start: FENCEPOST_PGWIRE_PORT: 127.0.0.1:${sql} is already in use (another fencepost serve? set FENCEPOST_PGWIRE_PORT)`);
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
  expect(listenError(denied, '127.0.0.1', 543, 'FENCEPOST_PGWIRE_PORT').message).toBe('FENCEPOST_PGWIRE_PORT: not allowed to listen on 127.0.0.1:543 (ports below 1024 need privileges)');
  expect(listenError(inUse, '127.0.0.1', 8080).setting).toBe('PORT'); // the HTTP door's, as before
});
