// `scripts/zookeeper.sh`: one standalone ZooKeeper server on 127.0.0.1, on a free port (from
// FENCEPOST_PORT_RANGE when set), with a temporary data dir, for trying `fencepost elect` by hand. Prints `ZK_CONNECT=127.0.0.1:<port>`
// on stdout once it serves, then runs until Ctrl-C / SIGTERM, when it stops the server and removes
// the data dir. Progress goes to stderr. (The server: src/demo/local-zookeeper.ts, as the tests'.)
import { parseArgs } from 'node:util';
import { LocalZooKeeper } from '../src/demo/local-zookeeper.ts';
import { portRange } from '../src/ports.ts';

const USAGE = `usage: scripts/zookeeper.sh
  runs a standalone ZooKeeper on 127.0.0.1 (a free port, from FENCEPOST_PORT_RANGE when set,
  e.g. 20000-20999) with a temporary data dir, prints
  ZK_CONNECT=127.0.0.1:<port>, and stops (removing its data) on Ctrl-C or SIGTERM`;

let values;
try {
  ({ values } = parseArgs({ options: { help: { type: 'boolean', short: 'h' } }, strict: true }));
} catch (err) {
  process.stderr.write(`zookeeper: ${(err as Error).message}\n${USAGE}\n`);
  process.exit(2);
}
if (values.help) {
  process.stdout.write(USAGE + '\n');
  process.exit(0);
}

try {
  portRange(); // FENCEPOST_PORT_RANGE, if set, is where the port comes from
} catch (err) {
  process.stderr.write(`zookeeper: ${(err as Error).message}\n`);
  process.exit(2);
}
process.stderr.write('zookeeper: starting a standalone server…\n');
let zk: LocalZooKeeper;
try {
  zk = await LocalZooKeeper.start({ servers: 1 });
} catch (err) {
  process.stderr.write(`zookeeper: ${(err as Error).message}\n`);
  process.exit(1);
}
let stopping = false;
const stop = (sig: NodeJS.Signals): void => {
  if (stopping) return;
  stopping = true;
  process.stderr.write(`zookeeper: ${sig}: stopping the server and removing its data\n`);
  void zk.stop().then(() => process.exit(0));
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
process.stdout.write(`ZK_CONNECT=${zk.connectString}\n`);
process.stderr.write(
  `zookeeper: serving at ${zk.connectString} until Ctrl-C; in another terminal: export ZK_CONNECT=${zk.connectString}\n`,
);
// Runs on: the server's output pipes keep the event loop alive until stop().
