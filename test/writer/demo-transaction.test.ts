// The demo's --pause-mid-transaction mode, end to end with real processes, ZooKeeper and Postgres
// (shortened timings): replica-1 (SQL endpoint) is frozen between its INSERT and its COMMIT, holding
// the fence; a new leader is elected, its raise ends the open transaction and its first write is
// accepted; resumed, the zombie's COMMIT fails with FP409 and its row is not in the database.
// Outcomes only: the printed time from the freeze to the first accepted write is not asserted.
import { afterAll, expect, inject, test } from 'vitest';
import { runDemo } from '../../src/demo/demo.ts';
import { clientRoleFor, createTestDatabase } from '../support/db.ts';

// A database of the file's own: the demos' GRANTs on one shared database, run side by side, fail
// with "tuple concurrently updated".
const db = await createTestDatabase({ migrate: false });
afterAll(() => db.drop());

test("paused mid-transaction, the zombie's COMMIT fails with FP409, its row never lands, and the new leader's first write is accepted", async () => {
  const lines: string[] = [];
  const result = await runDemo({
    replicas: 3,
    sessionTimeoutMs: 2000,
    pauseMs: 3500,
    intervalMs: 150,
    pauseMidTransaction: true,
    databaseUrl: db.url,
    zkConnect: inject('zkConnect'),
    clientRole: clientRoleFor(db.url),
    print: (l) => lines.push(l),
  });
  expect(result.failures).toEqual([]);
  const { zombie, successor, transaction } = result;
  expect(zombie?.replica).toBe('replica-1');
  expect(successor).not.toBeNull();
  expect(BigInt(successor!.token) > BigInt(zombie!.token)).toBe(true);
  expect(transaction).not.toBeNull();
  // The zombie held a transaction open (INSERT done, no COMMIT) when it was frozen.
  const held = result.events.find((e) => e.event === 'write-inserted' && e.held && e.replica === zombie!.replica);
  expect(held?.key).toBe(transaction!.zombieKey);
  // The new leader wrote while the zombie's transaction was still open on its side.
  const first = result.events.find((e) => e.event === 'write-accepted' && e.replica === successor!.replica && e.token === successor!.token);
  const refused = result.events.find((e) => e.event === 'write-rejected' && e.replica === zombie!.replica);
  expect(first).toBeDefined();
  expect(refused).toMatchObject({ transaction: true, key: transaction!.zombieKey, code: 'FP409', token: zombie!.token });
  expect(first!.t).toBeLessThan(refused!.t);
  expect(transaction!.commitCode).toBe('FP409');
  expect(transaction!.zombieRowPresent).toBe(false);
  expect(result.events.some((e) => e.event === 'stepped-down' && e.replica === zombie!.replica)).toBe(true);
  // The timeline tells it: freeze, new leader, its first accepted write, the refused COMMIT.
  const text = lines.join('\n');
  const order = [`SIGSTOP ${zombie!.replica}`, `${successor!.replica}`, "new leader's first write accepted", 'COMMIT REFUSED (FP409)'].map(
    (s) => text.indexOf(s),
  );
  expect(order.every((i) => i >= 0)).toBe(true);
  expect([...order].sort((a, b) => a - b)).toEqual(order);
  expect(text).toContain('its row is not in the database');
  expect(result.ok).toBe(true);
}, 120_000);
