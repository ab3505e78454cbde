// `fencepost doctor [--zk <connect>] [--database-url <url>] [--require-sync-standby] [--window-ms <n>]
// [--session-timeout-ms <n>] [--json]`: with --zk, measures ZooKeeper round trips and this
// process's event-loop stalls and recommends a session timeout; with --database-url (or
// DATABASE_URL), checks whether a Postgres failover keeps every fence raise (src/fence/durability.ts)
// and the protected data (src/fence/protect.ts protectedDataReport), and prints each warning. One
// convention for every part: exit 0: nothing to warn of; 3: a warning (a Postgres failover could
// lose a fence raise; a protected table not enforced or in a schema several roles may use; the
// --session-timeout-ms given is below the recommendation); 1: a check could not run (one line,
// naming the flag); 2: usage.
import { parseArgs } from 'node:util';
import pg from 'pg';
import { formatAdvice, measureSessionTimeoutAdvice } from '../election/index.ts';
import {
  checkDurability,
  type DurabilityReport,
  protectedDataReport,
  type ProtectedDataReport,
  clientConfig,
  checkDatabaseUrl,
  hearClientErrors,
  runningClusterUrl,
} from '../fence/admin.ts';
import { databaseError } from '../proxy/startup-errors.ts';
import { describeDatabase, embeddedPlace, noClusterMessage } from './database.ts';

export const DOCTOR_USAGE =
  'usage: fencepost doctor [--zk <connect-string>] [--database-url <postgres-url>] [--require-sync-standby] [--window-ms <n>] [--session-timeout-ms <n>] [--json]\n' +
  '  (at least one of --zk and --database-url; DATABASE_URL stands in for --database-url, and without\n' +
  '   either, the embedded Postgres a running `fencepost serve` started, FENCEPOST_DATA_DIR as for serve)';

/** Exit status when a part warned (its check ran). */
export const DOCTOR_UNSAFE_EXIT = 3;

export async function doctorCommand(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        zk: { type: 'string' },
        'database-url': { type: 'string' },
        'require-sync-standby': { type: 'boolean' },
        'window-ms': { type: 'string' },
        'session-timeout-ms': { type: 'string' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }));
  } catch (err) {
    process.stderr.write(`fencepost doctor: ${(err as Error).message}\n${DOCTOR_USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(DOCTOR_USAGE + '\n');
    return 0;
  }
  const positiveInt = (raw: string | undefined, name: string): number | undefined | null => {
    if (raw === undefined) return undefined;
    return /^\d+$/.test(raw) && Number(raw) > 0
      ? Number(raw)
      : (process.stderr.write(`fencepost doctor: ${name} must be a positive integer\n`), null);
  };
  const windowMs = positiveInt(values['window-ms'], '--window-ms');
  const configured = positiveInt(values['session-timeout-ms'], '--session-timeout-ms');
  let urlFlag = values['database-url'] !== undefined ? '--database-url' : 'DATABASE_URL';
  let databaseUrl = values['database-url'] ?? (env.DATABASE_URL || undefined);
  let from = `from ${urlFlag}`;
  let noDatabase = '';
  if (databaseUrl === undefined && !values.zk) {
    // Beside a running `fencepost serve` on the embedded Postgres: its cluster (the URL it recorded). Never one of its own.
    const place = embeddedPlace(env);
    const running = runningClusterUrl(place.dataDir);
    if (running !== null) {
      databaseUrl = running;
      urlFlag = 'FENCEPOST_DATA_DIR';
      from = `the embedded Postgres fencepost serve runs on ${place.dataDir}`;
    } else noDatabase = noClusterMessage(place, env);
  }
  if (windowMs === null || configured === null) return 2;
  if (!values.zk && databaseUrl === undefined) {
    process.stderr.write(`fencepost doctor: --zk or --database-url is required (${noDatabase})\n${DOCTOR_USAGE}\n`);
    return 2;
  }
  if (databaseUrl !== undefined) {
    try {
      if (!/^postgres(ql)?:\/\//.test(databaseUrl)) throw new Error('must be a postgres:// or postgresql:// URL');
      checkDatabaseUrl(databaseUrl);
    } catch (err) {
      process.stderr.write(`fencepost doctor: ${urlFlag}: ${(err as Error).message.split('\n')[0]}\n`);
      return 2;
    }
  }
  // Progress on stderr (stdout carries the result, e.g. --json for scripts).
  const progress = (step: string) => process.stderr.write(`fencepost doctor: ${step}…\n`);
  let advice;
  if (values.zk) {
    try {
      advice = await measureSessionTimeoutAdvice({ connect: values.zk, windowMs: windowMs ?? 5000, onProgress: progress });
    } catch (err) {
      process.stderr.write(`fencepost doctor: --zk ${values.zk}: ${(err as Error).message.split('\n')[0]}\n`);
      return 1;
    }
  }
  let durability: DurabilityReport | undefined;
  let protectedData: ProtectedDataReport | undefined;
  if (databaseUrl !== undefined) {
    process.stderr.write(`fencepost doctor: database ${describeDatabase(databaseUrl, from)}\n`);
    progress('checking whether a Postgres failover keeps every fence raise');
    const pool = hearClientErrors(new pg.Pool({ ...clientConfig(databaseUrl), max: 1 }));
    try {
      durability = await checkDurability(pool, { requireSyncStandby: values['require-sync-standby'] ?? false });
      progress('checking the protected data');
      protectedData = await protectedDataReport(pool);
    } catch (err) {
      // Where and why, never the URL's password.
      process.stderr.write(`fencepost doctor: ${databaseError(err, urlFlag, databaseUrl).message.split('\n')[0]}\n`);
      return 1;
    } finally {
      await pool.end().catch(() => {});
    }
  }
  if (values.json) {
    const out = {
      ...(advice ? { ...advice, configuredSessionTimeoutMs: configured ?? null } : {}),
      ...(durability ? { postgres: durability } : {}),
      ...(protectedData ? { protectedData } : {}),
    };
    process.stdout.write(JSON.stringify(out) + '\n');
  } else {
    const parts = [
      ...(advice ? [formatAdvice(advice, configured)] : []),
      ...(durability ? [formatDurability(durability)] : []),
      ...(protectedData ? [formatProtectedData(protectedData)] : []),
    ];
    process.stdout.write(parts.join('\n\n') + '\n');
  }
  const zkWarns = advice !== undefined && configured !== undefined && configured < advice.recommendedSessionTimeoutMs;
  const postgresWarns =
    (durability !== undefined && durability.reasons.length > 0) || (protectedData !== undefined && protectedData.warnings.length > 0);
  return zkWarns || postgresWarns ? DOCTOR_UNSAFE_EXIT : 0;
}

/** The protected-data part of the report: one warning per table or prefix, with its reason. */
export function formatProtectedData(r: ProtectedDataReport): string {
  const lines = ['Protected data:'];
  if (r.protected === 0) lines.push('  nothing is protected (fencepost protect)');
  else if (r.warnings.length === 0)
    lines.push(`  no warnings: ${r.protected} protected, each trigger enforced, each table in a schema only its writers may use`);
  for (const w of r.warnings) lines.push(`  warning [${w.reason}]: ${w.message}`);
  return lines.join('\n');
}

/** The Postgres part of the report, one warning per unsafe condition with its reason. */
export function formatDurability(r: DurabilityReport): string {
  const standbys =
    r.standbys === 'unknown'
      ? 'unknown (pg_stat_replication not readable)'
      : r.standbys.length === 0
        ? 'none'
        : r.standbys.map((s) => `${s.name ?? '?'} (${s.state ?? '?'}, ${s.syncState})`).join(', ');
  const lines = [
    'Postgres failover durability:',
    `  synchronous_commit (new sessions): ${r.synchronousCommit}`,
    `  synchronous_standby_names: ${r.synchronousStandbyNames === '' ? '(empty)' : r.synchronousStandbyNames}`,
    `  standbys: ${standbys}`,
    `  backends waiting on a synchronous standby: ${r.waitingOnStandby}`,
  ];
  if (r.warnings.length === 0) lines.push('  no warnings: a failover to a synchronous standby keeps every acknowledged fence raise');
  else r.warnings.forEach((w, i) => lines.push(`  warning [${r.reasons[i]}]: ${w}`));
  return lines.join('\n');
}
