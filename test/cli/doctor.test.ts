// `fencepost doctor`: the durability check once, from the command line, against a real primary
// with a real streaming standby, and the session-timeout advice against a real ZooKeeper. One exit
// convention for both parts: 0: no warnings; 3: a warning; 1: cannot connect (one line, no
// password); 2: usage.
import { afterAll, beforeAll, describe, expect, inject, test } from 'vitest';
import pg from 'pg';
import { setSynchronousStandbyNames, startReplicatedPostgres, type ReplicatedPostgres } from '../support/replication.ts';
import { run } from '../support/cli.ts';

describe('fencepost doctor --database-url', () => {
  let repl: ReplicatedPostgres;
  let admin: pg.Client;
  beforeAll(async () => {
    repl = await startReplicatedPostgres('fp_doctor');
    admin = new pg.Client({ connectionString: repl.url });
    await admin.connect();
  }, 120_000);
  afterAll(async () => {
    await admin?.end();
    await repl?.stop();
  });

  test('an asynchronous standby: prints the warning with its reason and exits 3, ZooKeeper not needed', () => {
    const r = run(['doctor', '--database-url', repl.url]);
    expect(r.status, r.stderr).toBe(3);
    expect(r.stdout).toContain('Postgres failover durability:');
    expect(r.stdout).toContain('standbys: fp_doctor (streaming, async)');
    expect(r.stdout).toMatch(/warning \[async_standby\]: asynchronous standby "fp_doctor" \(synchronous_standby_names is empty\)/);
    expect(r.stderr).toContain('fencepost doctor: checking whether a Postgres failover keeps every fence raise');
  });

  test('--json: the report under `postgres`; DATABASE_URL stands in for the flag', () => {
    const r = run(['doctor', '--json', '--require-sync-standby'], { DATABASE_URL: repl.url });
    expect(r.status, r.stderr).toBe(3);
    const out = JSON.parse(r.stdout) as { postgres: { reasons: string[]; standbys: unknown[]; waitingOnStandby: number } };
    expect(out.postgres.reasons).toEqual(['async_standby', 'no_sync_standby']);
    expect(out.postgres.standbys).toEqual([{ name: 'fp_doctor', state: 'streaming', syncState: 'async' }]);
    expect(out.postgres.waitingOnStandby).toBe(0);
  });

  test('a synchronous standby streaming: no warnings, exit 0; stopped: no synchronous standby streaming, exit 3', async () => {
    await setSynchronousStandbyNames(repl, repl.standbyName, 'sync');
    try {
      const ok = run(['doctor', '--database-url', repl.url]);
      expect(ok.status, ok.stderr).toBe(0);
      expect(ok.stdout).toContain('no warnings');
      await repl.stopStandby();
      const hung = run(['doctor', '--database-url', repl.url, '--json']);
      expect(hung.status, hung.stderr).toBe(3);
      expect((JSON.parse(hung.stdout) as { postgres: { reasons: string[] } }).postgres.reasons).toEqual(['no_sync_standby_streaming']);
    } finally {
      await admin.query('ALTER SYSTEM RESET synchronous_standby_names');
      await admin.query('SELECT pg_reload_conf()');
      await repl.startStandby();
    }
  });

  test('nothing listening: exit 1, one line naming the flag after the progress line, without the password', () => {
    const r = run(['doctor', '--database-url', 'postgres://someone:s3cret@127.0.0.1:1/db']);
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr.trimEnd().split('\n')).toEqual([
      'fencepost doctor: database 127.0.0.1:1 (database db), from --database-url',
      'fencepost doctor: checking whether a Postgres failover keeps every fence raise…',
      'fencepost doctor: --database-url: nothing is listening at 127.0.0.1:1 (connection refused)',
    ]);
    expect(r.stderr).not.toContain('s3cret');
    expect(r.stdout).toBe('');
  });

  test('--zk: a --session-timeout-ms below the recommendation warns and exits 3, as a Postgres warning does; one above it exits 0', () => {
    const zk = inject('zkConnect');
    const low = run(['doctor', '--zk', zk, '--window-ms', '300', '--session-timeout-ms', '1']);
    expect(low.status, low.stderr).toBe(3);
    expect(low.stdout).toContain('WARNING: the configured 1 ms is below the recommendation');
    // The recommendation has a floor and grows with stalls; a day is above it on any box.
    const high = run(['doctor', '--zk', zk, '--window-ms', '300', '--session-timeout-ms', '86400000']);
    expect(high.status, high.stderr).toBe(0);
    expect(high.stdout).toContain('the configured 86400000 ms is at or above the recommendation');
  });

  test('neither --zk nor --database-url: exit 2 with the usage', () => {
    const r = run(['doctor']);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('--zk or --database-url is required');
    expect(r.stderr).toContain('usage: fencepost doctor');
  });
});
