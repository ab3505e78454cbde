// Message orders where the proxy's picture of the backend's transaction state could go wrong: a
// message Postgres refuses (a Parse under a name already taken, a Close, anything in a failed
// transaction), a simple Query inside an open extended-protocol group, and whatever the planner
// predicted against what each ReadyForQuery says. Invariant of every test here: a session whose
// token is below the fence, or that has no token, commits nothing and runs nothing outside a fenced
// transaction (no VACUUM, no COMMIT PREPARED at top level), checked in Postgres itself.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, clientRoleFor, type TestDatabase } from '../../support/db.ts';
import { startSqlProxy, fenceOptions, fenceRow, type SqlProxy } from '../../support/sql.ts';
import { B, CLOSE, E, P, Q, RawClient, S, pbe, type Replies } from './raw-client.ts';
import { int16, int32, message } from '../../../src/proxy/sql/wire/framing.ts';

const FENCE_KEY = 'orders/main';

let db: TestDatabase;
let sql: SqlProxy;
beforeAll(async () => {
  db = await createTestDatabase();
  sql = await startSqlProxy(db);
  const role = clientRoleFor(db.url);
  await db.pool.query('CREATE TABLE public.orders (id int PRIMARY KEY, v text)');
  // MAINTAIN: a VACUUM that ran would run for real, so its CommandComplete shows it escaped.
  await db.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE, MAINTAIN ON public.orders TO ${role}`);
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(FENCE_KEY)}`, {
    method: 'PUT',
    headers: { 'fencing-token': '6' },
  });
  expect(res.status).toBe(200);
});
afterAll(async () => {
  await sql?.close();
  await db?.drop();
});

const ids = { next: 1 };
const present = async (id: number) => (await db.pool.query('SELECT 1 FROM public.orders WHERE id = $1', [id])).rowCount;

const sessions = {
  'a session whose token (5) is below the fence (6)': fenceOptions(5, FENCE_KEY),
  'a session without a token': '',
};

/** What runs once the transaction the writer ended is gone: statements for either protocol. */
interface Body {
  name: string;
  extended: (id: number) => Buffer[];
  simple: (id: number) => string;
}
const insert = (id: number) => `INSERT INTO public.orders VALUES (${id}, 'escaped')`;
const bodies: Body[] = [
  {
    name: 'BEGIN READ WRITE, INSERT, COMMIT',
    extended: (id) => [...pbe('BEGIN READ WRITE'), ...pbe(insert(id)), ...pbe('COMMIT')],
    simple: (id) => `BEGIN READ WRITE; ${insert(id)}; COMMIT`,
  },
  {
    name: 'SET TRANSACTION READ WRITE, INSERT',
    extended: (id) => [...pbe('SET TRANSACTION READ WRITE'), ...pbe(insert(id))],
    simple: (id) => `SET TRANSACTION READ WRITE; ${insert(id)}`,
  },
  {
    name: 'BEGIN READ WRITE, VACUUM, COMMIT',
    extended: () => [...pbe('BEGIN READ WRITE'), ...pbe('VACUUM public.orders'), ...pbe('COMMIT')],
    simple: () => 'BEGIN READ WRITE; VACUUM public.orders; COMMIT',
  },
  { name: 'VACUUM', extended: () => pbe('VACUUM public.orders'), simple: () => 'VACUUM public.orders' },
  {
    name: "BEGIN READ WRITE, COMMIT PREPARED 'x', COMMIT",
    extended: () => [...pbe('BEGIN READ WRITE'), ...pbe("COMMIT PREPARED 'x'"), ...pbe('COMMIT')],
    simple: () => "BEGIN READ WRITE; COMMIT PREPARED 'x'; COMMIT",
  },
  { name: "COMMIT PREPARED 'x'", extended: () => pbe("COMMIT PREPARED 'x'"), simple: () => "COMMIT PREPARED 'x'" },
];

/** The writer's first Query: a lone BEGIN, or BEGIN with a statement after it in the same Query. */
const entries = ['BEGIN', 'BEGIN; SELECT 1'];

/** Nothing of the session ran outside a fenced transaction, nothing committed, the fence stayed. */
async function expectNothingEscaped(replies: Replies[], id: number): Promise<void> {
  const tags = replies.flatMap((r) => r.tags);
  const errors = replies.flatMap((r) => r.errors);
  expect(tags).not.toContain('VACUUM');
  expect(tags).not.toContain('COMMIT PREPARED');
  expect(errors).not.toContain('42704'); // COMMIT PREPARED 'x' ran at top level: "does not exist"
  expect(await present(id)).toBe(0);
  expect(await fenceRow(db.pool, FENCE_KEY)).toEqual({ highest_token: '6' });
}

/** Replies up to the ReadyForQuery after an EmptyQueryResponse (the marker), or the connection's end. */
async function readUntilSelect(raw: RawClient): Promise<Replies> {
  const all: Replies[] = [];
  for (let i = 0; i < 6; i++) {
    const r = await raw.read(1);
    all.push(r);
    if (r.closed || r.frames.some((f) => f.type === 'I')) break;
  }
  return {
    frames: all.flatMap((r) => r.frames),
    errors: all.flatMap((r) => r.errors),
    tags: all.flatMap((r) => r.tags),
    rows: all.flatMap((r) => r.rows),
    parameters: all.flatMap((r) => r.parameters),
    status: all.at(-1)!.status,
    closed: all.some((r) => r.closed),
  };
}

for (const [who, options] of Object.entries(sessions)) {
  describe(who, () => {
    for (const body of bodies) {
      for (const entry of entries) {
        test(`${entry}; Close, a Query of ROLLBACK inside the group, then ${body.name}, Sync: nothing escapes`, async () => {
          const [raw, id] = [await RawClient.connect(sql.port, sql.database, 'tracking-a', options), ids.next++];
          const replies = [await raw.send([Q(entry)])];
          // A Query inside a group runs in the group's transaction once its answers are in, or is
          // skipped with the rest after an error (as Postgres does); then a ROLLBACK and a marker
          // (an empty Query: answered unfenced, stale or not).
          raw.write(CLOSE('S', 'nothing'), Q('ROLLBACK'), ...body.extended(id), S(), Q('ROLLBACK'), Q(''));
          replies.push(await readUntilSelect(raw));
          expect(replies[1]!.closed).toBe(false); // the session goes on
          raw.close();
          await expectNothingEscaped(replies, id);
        });

        test(`${entry}; Parse s1 = ROLLBACK, Parse s1 = SELECT 1 (refused), Sync; then Bind s1, Execute, ${body.name}, Sync: nothing escapes`, async () => {
          const [raw, id] = [await RawClient.connect(sql.port, sql.database, 'tracking-b', options), ids.next++];
          const replies = [await raw.send([Q(entry)])];
          replies.push(await raw.send([P('ROLLBACK', 's1'), P('SELECT 1', 's1'), S()]));
          replies.push(await raw.send([B('s1'), E(), ...body.extended(id), S()]));
          raw.close();
          await expectNothingEscaped(replies, id);
        });
      }

      test(`from idle, Parse BEGIN, then a Query inside the open group: ${body.name}: nothing escapes`, async () => {
        const [raw, id] = [await RawClient.connect(sql.port, sql.database, 'tracking-c', options), ids.next++];
        const replies = [await raw.send([P('BEGIN'), Q(body.simple(id)), S()], 2)];
        expect([replies[0]!.closed, replies[0]!.errors.at(-1)]).toEqual([true, '08P01']); // a Query inside a group ends the session
        raw.close();
        await expectNothingEscaped(replies, id);
      });
    }
  });
}

describe('a group whose Sync comes in a later write', () => {
  // Invariant: an error in a group makes the backend skip to the Sync however the writer's bytes
  // are split into writes; the writer gets the error, one ReadyForQuery, and a session that goes on.
  for (const [who, options] of Object.entries({ 'a leader': fenceOptions(1, 'orders/pipe'), 'a session without a token': '' })) {
    test(`${who}: Parse/Bind/Execute of a failing statement, more of the group and Sync 50 ms later: the error, and the session goes on`, async () => {
      const raw = await RawClient.connect(sql.port, sql.database, 'pipe-writer', options);
      raw.write(...pbe('SELECT 1/0'));
      await new Promise((r) => setTimeout(r, 50));
      const failed = await raw.send([...pbe('SELECT 2'), S()]);
      expect(failed).toMatchObject({ errors: ['22012'], status: 'I', closed: false });
      const next = await raw.send([...pbe('SELECT 3'), S()]);
      expect(next).toMatchObject({ errors: [], tags: ['SELECT 1'], status: 'I' });
      raw.close();
    });

    test(`${who}: Parse/Bind/Execute of a failing statement, then Sync 50 ms later: the error, and the session goes on`, async () => {
      const raw = await RawClient.connect(sql.port, sql.database, 'pipe-writer', options);
      raw.write(...pbe('SELECT 1/0'));
      await new Promise((r) => setTimeout(r, 50));
      const failed = await raw.send([S()]);
      expect(failed).toMatchObject({ errors: ['22012'], status: 'I', closed: false });
      const next = await raw.send([...pbe('SELECT 3'), S()]);
      expect(next).toMatchObject({ errors: [], tags: ['SELECT 1'], status: 'I' });
      raw.close();
    });
  }
});

/** Raise `fenceKey` to `token` through the proxy's HTTP door. */
async function raiseTo(fenceKey: string, token: number): Promise<void> {
  const res = await fetch(`${sql.proxy.url}/v1/fences/${encodeURIComponent(fenceKey)}`, {
    method: 'PUT',
    headers: { 'fencing-token': String(token) },
  });
  expect(res.status).toBe(200);
}

// Prepared statements and portals are one to Postgres when their names agree on the first 63 bytes
// (NAMEDATALEN-1, cut byte-wise, mid-character too); and a DO block can DEALLOCATE and PREPARE a
// named statement through SPI, where the proxy sees only the tag DO. Invariant: whatever the
// planner recorded for a name, a session whose token is below the fence commits nothing, and a
// current one gets what Postgres has under the name.
describe('prepared statement names as Postgres reads them', () => {
  // Names whose first 63 bytes agree: ASCII, and cut in the middle of 'é' (0xC3 0xA9).
  const stems = { '63 ASCII bytes': (c: string) => c.repeat(63), '62 bytes and half an é': (c: string) => `${c.repeat(62)}é` };
  let n = 0;
  /** A session with token 10 on a fence of its own (at 10), and that fence's key. */
  const session = async () => {
    const key = `names/${n++}`;
    await raiseTo(key, 10);
    return { key, raw: await RawClient.connect(sql.port, sql.database, 'names', fenceOptions(10, key)) };
  };
  /** A BEGIN with a mode: the proxy holds it when prepared under a name (a plain one goes as sent, the fence in front). */
  const MODAL_BEGIN = 'BEGIN ISOLATION LEVEL READ COMMITTED';
  /** X prepared as BEGIN, then Y (the same statement to Postgres) closed and prepared as `text`. */
  const swapByName = async (raw: RawClient, X: string, Y: string, text: string) => {
    expect((await raw.send([P(MODAL_BEGIN, X), S()])).errors).toEqual([]);
    expect((await raw.send([CLOSE('S', Y), P(text, Y), S()])).errors).toEqual([]);
  };

  for (const [name, stem] of Object.entries(stems)) {
    test(`${name}: a BEGIN replaced under a name read alike is no longer held, nor run ahead of the fence`, async () => {
      const { key, raw } = await session();
      const [held, named] = [ids.next++, ids.next++];
      await swapByName(raw, `${stem('a')}X`, `${stem('a')}Y`, insert(held));
      await swapByName(raw, `${stem('c')}X`, `${stem('c')}Y`, insert(named));
      await raiseTo(key, 11);
      // The lone Bind/Execute/Sync the proxy answers as a BEGIN when it thinks X is one.
      const first = await raw.send([B(`${stem('a')}X`), E(), S()]);
      expect(first.tags).not.toContain('BEGIN');
      expect(first.errors).toEqual(['FP409']);
      // On a named portal (never held): a BEGIN opening a group runs ahead of the fence.
      const second = await raw.send([B(`${stem('c')}X`, 'p'), E('p'), S()]);
      expect(second.errors).toEqual(['FP409']);
      expect(await present(held)).toBe(0);
      expect(await present(named)).toBe(0);
      raw.close();
    });
  }

  test('a current session runs what Postgres holds under the name: the INSERT, not a BEGIN', async () => {
    const { raw } = await session();
    const id = ids.next++;
    const stem = stems['63 ASCII bytes']('a');
    await swapByName(raw, `${stem}X`, `${stem}Y`, insert(id));
    const r = await raw.send([B(`${stem}X`), E(), S()]);
    expect(r.tags).toEqual(['INSERT 0 1']);
    expect(r.status).toBe('I');
    expect(await present(id)).toBe(1);
    raw.close();
  });

  test('DEALLOCATE of a name longer than 63 bytes in a Query forgets the statement it drops', async () => {
    const { key, raw } = await session();
    const id = ids.next++;
    const long = 'b'.repeat(66); // the parser cuts it to 63, as Postgres does
    expect((await raw.send([P('BEGIN', long), S()])).errors).toEqual([]);
    expect((await raw.send([Q(`DEALLOCATE ${long}`)])).errors).toEqual([]);
    expect((await raw.send([Q(`PREPARE ${long} AS ${insert(id)}`)])).errors).toEqual([]);
    await raiseTo(key, 11);
    const r = await raw.send([B(long, 'p'), E('p'), S()]);
    expect(r.errors.length).toBeGreaterThan(0);
    expect(await present(id)).toBe(0);
    raw.close();
  });

  /** The named statement `name` becomes `text` inside a DO block: the proxy sees the tag DO. */
  const swapInDo = (name: string, text: string) =>
    Q(`BEGIN; DO $$BEGIN EXECUTE 'DEALLOCATE ${name}'; EXECUTE 'PREPARE ${name} AS ${text.replaceAll("'", "''")}'; END$$; COMMIT`);

  test('a held BEGIN is sent as its own text: the statement swapped in a DO block does not run', async () => {
    const { key, raw } = await session();
    const id = ids.next++;
    expect((await raw.send([P(MODAL_BEGIN, 'trap'), S()])).errors).toEqual([]);
    expect((await raw.send([swapInDo('trap', insert(id))])).errors).toEqual([]);
    await raiseTo(key, 11);
    // Answered by the proxy (BEGIN), held, and sent in front of the next Query, with the fence.
    expect((await raw.send([B('trap'), E(), S()])).tags).toEqual(['BEGIN']);
    const after = await raw.send([Q('SELECT 1')]);
    expect(after.errors).toEqual(['FP409']);
    await raw.send([Q('ROLLBACK')]);
    expect(await present(id)).toBe(0);
    raw.close();
  });

  test('a plain named BEGIN goes as sent, behind the fence: swapped in a DO block, what runs is fenced', async () => {
    // Invariant: whatever the name holds when bound (SQL PREPARE makes only SELECT, INSERT, UPDATE,
    // DELETE, MERGE or VALUES), a stale session commits nothing, and the next group is fenced too.
    const { key, raw } = await session();
    const id = ids.next++;
    expect((await raw.send([P('BEGIN', 'trap'), S()])).errors).toEqual([]);
    expect((await raw.send([swapInDo('trap', insert(id))])).errors).toEqual([]);
    await raiseTo(key, 11);
    const r = await raw.send([B('trap'), E(), S()]);
    expect(r.errors).toEqual(['FP409']);
    expect(r.status).toBe('I');
    expect((await raw.send([...pbe(insert(ids.next++)), S()])).errors).toEqual(['FP409']);
    expect(await present(id)).toBe(0);
    raw.close();
  });

  test('a session without a token: the block a plain named BEGIN opens behind the read-only fence stays read-only', async () => {
    const raw = await RawClient.connect(sql.port, sql.database, 'names', '');
    const id = ids.next++;
    expect((await raw.send([P('BEGIN', 'b'), P(insert(id), 'i'), S()])).errors).toEqual([]);
    const begun = await raw.send([B('b'), E(), S()]);
    expect([begun.errors, begun.tags, begun.status]).toEqual([[], ['BEGIN'], 'T']);
    expect((await raw.send([B('i'), E(), S()])).errors).toEqual(['25006']);
    await raw.send([Q('ROLLBACK')]);
    expect(await present(id)).toBe(0);
    raw.close();
  });

  test('pgbench-like: a named BEGIN (plain: not held) opens a fenced block; a current session commits', async () => {
    const { raw } = await session();
    const id = ids.next++;
    expect((await raw.send([P('BEGIN', 'b'), P(insert(id), 'i'), P('COMMIT', 'c'), S()])).errors).toEqual([]);
    expect((await raw.send([B('b'), E(), S()])).tags).toEqual(['BEGIN']);
    const ins = await raw.send([B('i'), E(), S()]);
    expect(ins.tags).toEqual(['INSERT 0 1']);
    expect(ins.status).toBe('T');
    expect((await raw.send([B('c'), E(), S()])).tags).toEqual(['COMMIT']);
    expect(await present(id)).toBe(1);
    raw.close();
  });

  test("a held BEGIN leaves the writer's unnamed statement as it was: bound after it, it runs", async () => {
    const { raw } = await session();
    expect((await raw.send([P('SELECT 41 + 1'), S()])).errors).toEqual([]);
    expect((await raw.send([P('BEGIN', 'b'), S()])).errors).toEqual([]);
    expect((await raw.send([B('b'), E(), S()])).tags).toEqual(['BEGIN']);
    const r = await raw.send([B(), E(), S()]);
    expect(r.errors).toEqual([]);
    expect(r.rows).toEqual([['42']]);
    expect(r.status).toBe('T');
    expect((await raw.send([Q('COMMIT')])).tags).toEqual(['COMMIT']);
    raw.close();
  });

  test('a named statement prepared as SET fencepost.token and swapped in a DO block does not run unfenced', async () => {
    const { key, raw } = await session();
    const id = ids.next++;
    expect((await raw.send([P("SET fencepost.token = '10'", 'tok'), S()])).errors).toEqual([]);
    expect((await raw.send([swapInDo('tok', insert(id))])).errors).toEqual([]);
    await raiseTo(key, 11);
    const r = await raw.send([B('tok'), E(), S()]);
    expect(r.errors).toEqual(['FP409']);
    expect(await present(id)).toBe(0);
    raw.close();
  });
});

describe('a lone Sync (no group open)', () => {
  test('after a BEGIN the proxy answered and holds: the block, as Postgres answers; the block goes on fenced', async () => {
    const raw = await RawClient.connect(sql.port, sql.database, 'lone-sync', fenceOptions(1, 'orders/lone-held'));
    const id = ids.next++;
    try {
      expect(await raw.send([Q('BEGIN')])).toMatchObject({ errors: [], tags: ['BEGIN'], status: 'T' });
      expect(await raw.send([S()])).toMatchObject({ errors: [], status: 'T', closed: false });
      expect(await raw.send([Q(insert(id))])).toMatchObject({ errors: [], tags: ['INSERT 0 1'], status: 'T' });
      expect(await raw.send([Q('COMMIT')])).toMatchObject({ errors: [], tags: ['COMMIT'], status: 'I' });
    } finally {
      raw.close();
    }
    expect(await present(id)).toBe(1);
  });

  // Invariant: a lone Sync changes nothing on the backend; its ReadyForQuery says the state the
  // last one said, and the session goes on (it ended with XX000 in a block a Query opened: the
  // Sync was checked against the block state the last extended group left). A failed block
  // reported for statements that end the block with nothing failing is not accepted (relay.ts
  // predictionHolds): that ReadyForQuery answers something else.
  for (const [who, options] of Object.entries({ 'a leader': fenceOptions(1, 'orders/lone'), 'a session without a token': '' })) {
    test(`${who}: in a block and in a failed block a Query opened, after an extended group at idle`, async () => {
      const raw = await RawClient.connect(sql.port, sql.database, 'lone-sync', options);
      try {
        expect(await raw.send([...pbe('SELECT 1'), S()])).toMatchObject({ errors: [], status: 'I' });
        expect(await raw.send([Q('BEGIN; SELECT 1')])).toMatchObject({ errors: [], status: 'T' });
        expect(await raw.send([S()])).toMatchObject({ errors: [], status: 'T', closed: false });
        expect(await raw.send([Q('SELECT 1/0')])).toMatchObject({ errors: ['22012'], status: 'E' });
        expect(await raw.send([S(), S()], 2)).toMatchObject({ errors: [], status: 'E', closed: false });
        expect(await raw.send([Q('ROLLBACK')])).toMatchObject({ errors: [], tags: ['ROLLBACK'], status: 'I' });
        expect(await raw.send([S()])).toMatchObject({ errors: [], status: 'I', closed: false });
      } finally {
        raw.close();
      }
    });
  }
});

// SQL EXECUTE runs whatever the writer prepared under the name with Parse, a COMMIT AND CHAIN too:
// the planner reads `EXECUTE cc` as an ordinary statement, and Postgres chains only at the end of
// the Query or at Sync, after any proof the group carried, into a block the proof never saw
// (red team round 6). Invariant: nothing a session sends after a raise above its token lands, and
// a current session goes on writing (the next statement gets the proof: relay.ts writerEnded).
describe('SQL EXECUTE of a COMMIT AND CHAIN prepared with Parse', () => {
  let n = 0;
  const protocols = {
    simple: {
      open: (raw: RawClient) => raw.send([Q('BEGIN')]).then(() => raw.send([Q('SELECT 1')])),
      chain: (raw: RawClient) => raw.send([Q('EXECUTE cc')]),
      write: (raw: RawClient, id: number) => raw.send([Q(insert(id))]),
    },
    extended: {
      open: (raw: RawClient) => raw.send([B('b'), E(), S()]),
      chain: (raw: RawClient) => raw.send([...pbe('EXECUTE cc'), S()]),
      write: (raw: RawClient, id: number) => raw.send([...pbe(insert(id)), S()]),
    },
  };
  for (const [protocol, p] of Object.entries(protocols)) {
    for (const raised of [true, false]) {
      test(`${protocol} protocol, ${raised ? 'a raise above the session after the chain: nothing lands' : 'no raise: the chained block commits'}`, async () => {
        const key = `orders/execute-chain/${n++}`;
        await raiseTo(key, 10);
        const raw = await RawClient.connect(sql.port, sql.database, 'execute-chain', fenceOptions(10, key));
        const id = ids.next++;
        expect((await raw.send([P('BEGIN', 'b'), P('COMMIT AND CHAIN', 'cc'), S()])).errors).toEqual([]);
        expect((await p.open(raw)).status).toBe('T');
        const chained = await p.chain(raw);
        expect([chained.tags, chained.status]).toEqual([['COMMIT'], 'T']);
        if (raised) await raiseTo(key, 11); // nothing of the session holds the epoch now
        const written = await p.write(raw, id);
        const committed = await raw.send([Q('COMMIT')]);
        raw.close();
        if (raised) {
          expect(written.errors).toHaveLength(1); // FP409, or XX000 when the proof reads a catalog the raise changed under it
          expect(committed.tags).toEqual(['ROLLBACK']);
          expect(await present(id)).toBe(0);
        } else {
          expect([written.errors, committed.tags]).toEqual([[], ['COMMIT']]);
          expect(await present(id)).toBe(1);
        }
      });
    }
  }
});

// A group whose BEGIN never ran (its Bind failed) left "the block owes its fence" set at its Sync,
// though the backend was idle; a BEGIN the proxy then held made the session look in a block, and
// the next Query's proof went ahead of it as a Query of its own, to the idle backend: the writer's
// INSERT ran in a transaction of its own, unfenced (red team round 7). Invariant: neither a stale
// nor a tokenless session commits a row, and a current one still writes in the block it opened.
describe('an owed fence never outlives its block', () => {
  /** Bind of the unnamed statement with one text parameter (a BEGIN takes none: 08P01). */
  const bindOneParameter = message('B', '', '', int16(0), int16(1), int32(1), Buffer.from('1'), int16(0));
  const steps = async (raw: RawClient, id: number) => {
    const failed = await raw.send([P('BEGIN'), bindOneParameter, E(), S()]);
    expect([failed.errors, failed.status]).toEqual([['08P01'], 'I']);
    expect((await raw.send([Q('BEGIN')])).status).toBe('T');
    const written = await raw.send([Q(insert(id))]);
    const ended = await raw.send([Q('COMMIT')]);
    return { written, ended };
  };
  test('a stale session and a session without a token commit nothing', async () => {
    await raiseTo('orders/owed', 10);
    const stale = await RawClient.connect(sql.port, sql.database, 'owed', fenceOptions(10, 'orders/owed'));
    expect((await stale.send([Q('SELECT 1')])).errors).toEqual([]); // fenced at 10: read-write by default
    await raiseTo('orders/owed', 11);
    const tokenless = await RawClient.connect(sql.port, sql.database, 'owed', '');
    expect((await tokenless.send([Q('SET default_transaction_read_only = off')])).errors).toEqual([]);
    for (const [raw, code] of [
      [stale, 'FP409'],
      [tokenless, '25006'],
    ] as const) {
      const id = ids.next++;
      const { written, ended } = await steps(raw, id);
      expect([written.errors, ended.tags]).toEqual([[code], ['ROLLBACK']]);
      raw.close();
      expect(await present(id)).toBe(0);
    }
  });
  test('a current session writes in the block its BEGIN opened', async () => {
    await raiseTo('orders/owed-current', 10);
    const raw = await RawClient.connect(sql.port, sql.database, 'owed', fenceOptions(10, 'orders/owed-current'));
    const id = ids.next++;
    const { written, ended } = await steps(raw, id);
    expect([written.errors, written.tags, ended.tags]).toEqual([[], ['INSERT 0 1'], ['COMMIT']]);
    raw.close();
    expect(await present(id)).toBe(1);
  });
});
