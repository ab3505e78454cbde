// A pooled connection checked out for one piece of work, and given back whatever happens.
//
// node-postgres listens for a client's 'error' event only while the client is idle in its pool. A
// connection lost while checked out (a Postgres crash, a failover) emits 'error' on the client, and
// an 'error' event nobody hears ends the process. So every checkout listens for as long as it
// holds the client; the query in flight rejects too, and that rejection is what the work reports.
// A client that broke, whose work failed with an error that ends the connection (a FATAL from a
// terminated backend comes as the query's error, before the socket closes), or that the work asks
// to drop (a COMMIT still in flight, a session lock that could not be released), is destroyed
// instead of going back to the pool, where the next checkout would meet its end.
import type pg from 'pg';
import { endsConnection } from './pg-errors.ts';

/**
 * Makes every client of `pool` hear its own 'error' events, for good, and returns the pool. pg-pool
 * listens on a client only while it sits idle, and stops before the checkout's promise settles: a
 * FATAL that reaches a new connection in the same read as its first ReadyForQuery (a backend ended
 * right after startup) is emitted before whoever checked it out can listen. Heard here, it only
 * marks the client broken; the holder's next query reports it, and release drops the client.
 */
export function hearClientErrors(pool: pg.Pool): pg.Pool {
  pool.on('error', () => {}); // an idle client's: pg-pool drops it
  pool.on('connect', (client) => client.on('error', () => {}));
  return pool;
}

/** What the work may do with its checkout besides querying it. */
export interface Checkout {
  /** Destroy the connection on release instead of pooling it. */
  discard(reason?: unknown): void;
}

export async function withClient<T>(pool: pg.Pool, work: (client: pg.PoolClient, checkout: Checkout) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | true | undefined;
  const onError = (err: Error) => (broken = err);
  client.on('error', onError);
  const checkout: Checkout = {
    discard: (reason) => {
      if (broken === undefined) broken = reason instanceof Error ? reason : true;
    },
  };
  try {
    return await work(client, checkout);
  } catch (err) {
    if (endsConnection(err)) checkout.discard(err);
    throw err;
  } finally {
    client.off('error', onError);
    client.release(broken);
  }
}
