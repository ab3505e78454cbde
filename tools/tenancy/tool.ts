// `npm run chaos -- --tenancy <seconds>`: the tenant-isolation harness (run.ts) on an embedded
// Postgres of its own and an in-process proxy with the SQL endpoint: every attack alone (so a
// violation names its attack), in a seeded order, until the time is up; `--open` adds the
// documented open lock-queue attacks (docs/security.md, Tenants), `--attacks` keeps the attacks
// whose name contains the text. The test (test/tenancy/isolation.test.ts) runs a few mixes.
import { portRangeEnv } from '../ports.ts';
import pino from 'pino';
import { loadConfig } from '../../src/proxy/config.ts';
import { startProxy } from '../../src/proxy/server.ts';
import { withScratchDatabase } from '../postgres.ts';
import { createTenantRoles, createTenantTables, tenantNames } from './tenants.ts';
import { runTenancy } from './run.ts';

export async function runTenancyTool(o: {
  seed: number;
  durationMs: number;
  attacks?: string;
  open: boolean;
  print?: (l: string) => void;
}): Promise<boolean> {
  const print = o.print ?? ((l: string) => process.stdout.write(l + '\n'));
  return await withScratchDatabase(
    { prefix: 'fencepost-tenancy-', database: 'tenancy', postgresFlags: ['-c', 'max_connections=300'] },
    async ({ url, pool }) => {
      const t = tenantNames();
      await createTenantRoles(pool, t);
      const config = loadConfig({
        DATABASE_URL: url,
        PORT: '0',
        FENCEPOST_PGWIRE_PORT: '0',
        FENCEPOST_CLIENT_ROLE: 'fpc_tenancy',
        FENCEPOST_LOG_LEVEL: 'silent',
        FENCEPOST_KEYS: t.keysJson,
        FENCEPOST_READ_ACCESS: 'key',
        ...portRangeEnv(),
      });
      const proxy = await startProxy(config, pino({ level: 'silent' }));
      try {
        await createTenantTables(pool, t);
        const report = await runTenancy({
          seed: o.seed,
          e: { http: proxy.url, pgwirePort: proxy.pgwirePort!, database: 'tenancy', adminUrl: url },
          t,
          windowMs: 2500,
          cases: 0,
          attacksPerCase: 1,
          single: true,
          filter: (a) => (o.open || !a.knownOpen) && (o.attacks === undefined || a.name.includes(o.attacks)),
          deadlineMs: o.durationMs,
          print,
        });
        const failed = report.cases.filter((c) => c.violations.length > 0);
        print(
          `\ntenancy: seed ${report.seed}, ${report.cases.length} attacks run alone of ${report.attackCount} in ${(report.elapsedMs / 1000).toFixed(0)} s; ${failed.length} broke B's bound${failed.length ? ':' : ''}`,
        );
        for (const c of failed) print(`  ${c.knownOpen ? '(known open) ' : ''}${c.attacks.join(' + ')}: ${c.violations.join('; ')}`);
        if (report.soloTooSlow) print("  (B's solo p99 was above the slack: the box is too loaded for the bound to catch a 1 s freeze)");
        return failed.length === 0;
      } finally {
        await proxy.close();
      }
    },
  );
}
