// `fencepost leader --zk <connect> --path <election-path> [--json]`: who leads now, and with which
// token. Reads the lowest candidate under the election path (as every candidate does); needs no
// credentials, since election nodes are readable by everyone.
//   exit 0: a leader (text `<id> token <token>`, or JSON {"electionPath","id","token"})
//   exit 3: nobody leads: the election path exists, no candidate is in it (JSON with id and token null)
//   exit 4: no such election: the path does not exist in ZooKeeper (a typo in --path, or no
//           candidate has ever joined); JSON adds "pathExists": false, and stderr says so
//   exit 1: ZooKeeper unreachable; exit 2: usage error
import { parseArgs } from 'node:util';
import { readLeader, ZkSession, ZK_CONNECT_WAIT_MS, electionPathProblem } from '../election/index.ts';

export const LEADER_USAGE = 'usage: fencepost leader --zk <connect-string> --path <election-path> [--json]';

export async function leaderCommand(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: { zk: { type: 'string' }, path: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
      strict: true,
    }));
  } catch (err) {
    process.stderr.write(`fencepost leader: ${(err as Error).message}\n${LEADER_USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(LEADER_USAGE + '\n');
    return 0;
  }
  const { zk, path } = values;
  if (!zk || !path || electionPathProblem(path) !== null) {
    process.stderr.write(
      `fencepost leader: --zk and --path (an absolute ZooKeeper path without a trailing slash) are required\n${LEADER_USAGE}\n`,
    );
    return 2;
  }
  let session: ZkSession;
  try {
    session = await ZkSession.open({ connect: zk, sessionTimeoutMs: 10_000, connectTimeoutMs: ZK_CONNECT_WAIT_MS });
  } catch (err) {
    process.stderr.write(`fencepost leader: ${(err as Error).message}\n`);
    return 1;
  }
  try {
    if ((await session.exists(path)) === null) {
      if (values.json) process.stdout.write(JSON.stringify({ electionPath: path, id: null, token: null, pathExists: false }) + '\n');
      process.stderr.write(
        `fencepost leader: no election at ${path}: the path does not exist in ZooKeeper (check --path; it is created when the first candidate joins)\n`,
      );
      return 4;
    }
    const leader = await readLeader(session, path);
    if (values.json) {
      process.stdout.write(JSON.stringify({ electionPath: path, id: leader?.id ?? null, token: leader?.token.toString() ?? null }) + '\n');
    } else if (leader) {
      process.stdout.write(`${leader.id} token ${leader.token}\n`);
    } else {
      process.stderr.write(`fencepost leader: nobody leads ${path} (the election exists; no candidate is in it)\n`);
    }
    return leader ? 0 : 3;
  } catch (err) {
    process.stderr.write(`fencepost leader: ${(err as Error).message}\n`);
    return 1;
  } finally {
    await session.close();
  }
}
