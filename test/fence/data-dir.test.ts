// The embedded Postgres's default data folder survives a reboot: never under the temp folder, and
// a folder fencepost 0.1 left there is moved to the new place once, with its fences. Invariant:
// the fence rows written before the move are the ones read after it; nothing is moved from under
// a running Postgres.
import { afterAll, describe, expect, test } from 'vitest';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { defaultDataDir } from '../../src/proxy/config.ts';
import { adoptLegacyDataDir } from '../../src/proxy/server.ts';
import { StartupError } from '../../src/proxy/startup-errors.ts';
import { moveDataDir, PostgresAlreadyRunningError, startEmbeddedPostgres } from '../../src/fence/embedded-postgres.ts';

const dir = mkdtempSync(join(tmpdir(), 'fencepost-data-dir-'));
chmodSync(dir, 0o755); // as root, Postgres runs as the postgres user
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the default data folder', () => {
  test("is per checkout, in the user's data home ($XDG_DATA_HOME, else ~/.local/share), /var/lib/fencepost as root; never the temp folder", () => {
    const root = '/srv/app/node_modules/fencepost';
    expect(defaultDataDir(root, 1000, { XDG_DATA_HOME: '/home/u/.data', HOME: '/home/u' })).toMatch(
      /^\/home\/u\/\.data\/fencepost\/[0-9a-f]{12}\/pgdata$/,
    );
    expect(defaultDataDir(root, 1000, { HOME: '/home/u' })).toMatch(/^\/home\/u\/\.local\/share\/fencepost\/[0-9a-f]{12}\/pgdata$/);
    // A relative XDG_DATA_HOME is ignored, as the XDG spec says.
    expect(defaultDataDir(root, 1000, { XDG_DATA_HOME: 'data', HOME: '/home/u' })).toMatch(/^\/home\/u\/\.local\/share\/fencepost\//);
    expect(defaultDataDir(root, 0, { HOME: '/root' })).toMatch(/^\/var\/lib\/fencepost\/[0-9a-f]{12}\/pgdata$/);
    expect(defaultDataDir(root, 1000, { HOME: '/home/u' })).not.toBe(defaultDataDir('/srv/other', 1000, { HOME: '/home/u' }));
    for (const uid of [0, 1000]) expect(defaultDataDir(root, uid, { HOME: '/home/u' }).startsWith(tmpdir())).toBe(false);
  });
});

describe('a data folder under the temp folder (fencepost 0.1)', () => {
  const logged: string[] = [];
  const logger = { info: (_: object, msg: string) => void logged.push(msg), warn: (_: object, msg: string) => void logged.push(msg) };
  const adopt = (from: string, to: string) => adoptLegacyDataDir(from, to, moveDataDir, PostgresAlreadyRunningError, logger);

  test(
    'is moved to the new place once, with its fence rows; a running one is refused in one line and left alone',
    { timeout: 120_000 },
    async () => {
      const from = join(dir, 'tmp', 'fencepost-0-abc', 'pgdata');
      const to = join(dir, 'home', 'fencepost', 'abc', 'pgdata');
      const first = await startEmbeddedPostgres({ dataDir: from, port: 0 });
      const c = new pg.Client(first.url);
      await c.connect();
      await c.query('CREATE TABLE fences_before (fence_key text PRIMARY KEY, highest_token bigint)');
      await c.query("INSERT INTO fences_before VALUES ('orders', 42)");
      await c.end();
      let refused: unknown;
      try {
        adopt(from, to);
      } catch (err) {
        refused = err;
      }
      expect(refused).toBeInstanceOf(StartupError);
      expect(String((refused as Error).message)).toMatch(/in use by a running Postgres \(pid \d+\): stop it, then start again/);
      expect(existsSync(join(from, 'PG_VERSION'))).toBe(true);
      expect(existsSync(to)).toBe(false);
      await first.stop();

      adopt(from, to);
      expect(existsSync(from)).toBe(false);
      expect(logged.at(-1)).toContain(`moved the embedded Postgres's data from ${from} to ${to}`);
      const moved = await startEmbeddedPostgres({ dataDir: to, port: 0 });
      const d = new pg.Client(moved.url);
      await d.connect();
      expect((await d.query('SELECT fence_key, highest_token::int AS t FROM fences_before')).rows).toEqual([
        { fence_key: 'orders', t: 42 },
      ]);
      await d.end();
      await moved.stop();

      // Once: with nothing left at the old place, nothing happens; with both, the new one wins and the old is named.
      const before = logged.length;
      adopt(from, to);
      expect(logged.length).toBe(before);
    },
  );

  test('when the new place already has a cluster, the old folder is named in one warning and not touched', () => {
    const logged2: string[] = [];
    const from = join(dir, 'both-old');
    const to = join(dir, 'both-new');
    for (const d of [from, to]) looksInitialised(d);
    adoptLegacyDataDir(
      from,
      to,
      () => {
        throw new Error('must not move');
      },
      PostgresAlreadyRunningError,
      { info: () => {}, warn: (_: object, msg: string) => void logged2.push(msg) },
    );
    expect(logged2).toEqual([`an older data folder of this checkout remains at ${from}, unused: this proxy keeps its fences in ${to}`]);
  });
});

/** A folder that looks initialised (PG_VERSION), no cluster needed. */
function looksInitialised(d: string): void {
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, 'PG_VERSION'), '18\n');
}
