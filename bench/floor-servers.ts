// Servers with no logic, each a process of its own, for the runtime's floor (bench/floor.ts,
// bench/sql-endpoint.ts path `relay`): what Node costs per operation before fencepost does anything.
//   relay PORT PGHOST PGPORT   a TCP relay: each connection to PORT gets one to Postgres, bytes copied
//                              both ways as they come ('data' → write, no parsing, no buffering);
//   http PORT                  node:http: reads the body, answers 200 with a small JSON body;
//   fastify PORT               fastify 5, one PUT route: the JSON body parsed, a JSON reply.
// PORT 0: a free port, of FENCEPOST_PORT_RANGE when set. Prints `ready <port>` once listening.
import http from 'node:http';
import net from 'node:net';
import Fastify from 'fastify';
import { listenInRange, portRange } from '../src/ports.ts';

const [kind, portArg, pgHost, pgPort] = process.argv.slice(2);
const port = Number(portArg);
const REPLY = { accepted: true, highestToken: '1', version: '2' };
const ready = (server: net.Server) => process.stdout.write(`ready ${(server.address() as net.AddressInfo).port}\n`);
/** Listens `server` on PORT (0: `listenInRange`'s free port); then says so. */
const listenOn = (server: net.Server) =>
  listenInRange(
    port,
    portRange(),
    (p) =>
      new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(p, '127.0.0.1', () => {
          server.off('error', reject);
          resolve();
        });
      }),
  ).then(() => ready(server));

if (kind === 'relay') {
  const server = net.createServer((client) => {
    const db = net.connect(Number(pgPort), pgHost);
    client.setNoDelay(true);
    db.setNoDelay(true);
    client.on('data', (d) => db.write(d));
    db.on('data', (d) => client.write(d));
    const end = () => {
      client.destroy();
      db.destroy();
    };
    for (const s of [client, db]) {
      s.on('error', end);
      s.on('close', end);
    }
  });
  await listenOn(server);
} else if (kind === 'http') {
  const body = JSON.stringify(REPLY);
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  await listenOn(server);
} else if (kind === 'fastify') {
  const app = Fastify({ logger: false });
  app.put('/v1/objects/:key', async (req) => {
    if (typeof req.body !== 'object' || req.body === null) throw new Error('no JSON body');
    return REPLY;
  });
  await listenInRange(port, portRange(), (p) => app.listen({ port: p, host: '127.0.0.1' }));
  ready(app.server);
} else {
  process.stderr.write(`usage: floor-servers.ts relay PORT PGHOST PGPORT | http PORT | fastify PORT\n`);
  process.exit(2);
}
