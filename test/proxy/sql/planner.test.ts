// The SQL door's planner without sockets: what goes to the backend for each of the writer's
// messages (the writer's own, or the proxy's), and which responses are swallowed (`injected`, or
// the fence's statements in a Query's `plan`).
import { describe, expect, test } from 'vitest';
import { Planner, provenSessionFence, readOnlySessionFence, type PlanContext, type Step } from '../../../src/proxy/sql/planner.ts';
import { cstr, int16, int32, message } from '../../../src/proxy/sql/wire/framing.ts';
import { decodeClient, encode, type ClientMessage } from '../../../src/proxy/sql/wire/frontend.ts';
import { parseErrorFields, readyForQuery } from '../../../src/proxy/sql/wire/backend.ts';
import { RESET_READ_ONLY_SQL } from '../../../src/proxy/sql/proof.ts';

const IDLE: PlanContext = { status: 'I', awaiting: false };
const IN_BLOCK: PlanContext = { status: 'T', awaiting: false };
const FAILED: PlanContext = { status: 'E', awaiting: false };

const planner = () => new Planner(provenSessionFence({ fenceKey: 'app/orders', token: 5n }, '16384'));

const query = (text: string): ClientMessage => ({ type: 'query', text });
const parse = (text: string, name = ''): ClientMessage => ({ type: 'parse', name, text, paramTypes: [] });
const bind = (statement = '', portal = ''): ClientMessage => ({ type: 'bind', portal, statement });
const execute = (portal = ''): ClientMessage => ({ type: 'execute', portal, maxRows: 0 });
const sync: ClientMessage = { type: 'sync' };

/** What each step sends: 'writer' for the writer's message as it came, else what the proxy sends or does. */
const sent = (steps: Step[]) => steps.map((s) => (s.do === 'forward' ? 'writer' : s.do === 'send' ? s.what : s.do));

/** The kinds of the messages of the fence step among these steps. */
const fenceStep = (steps: Step[]) => {
  const f = steps.find((s) => s.do === 'send' && s.what === 'fence');
  if (f === undefined || f.do !== 'send') throw new Error(`no fence: ${JSON.stringify(sent(steps))}`);
  return f.expect.map((e) => e.kind);
};

/** The extended-protocol group's steps, per message. */
const group = (p: Planner, ctx: PlanContext, ...messages: ClientMessage[]) => messages.map((m) => sent(p.plan(m, ctx)));

const fencedQuery = (steps: Step[]) => {
  expect(steps).toHaveLength(1);
  const step = steps[0]!;
  if (step.do !== 'send' || step.what !== 'fencedQuery') throw new Error(`not a fenced Query: ${JSON.stringify(sent(steps))}`);
  expect(step.bytes.equals(encode({ type: 'query', text: step.text! }))).toBe(true);
  return { text: step.text!, expect: step.expect[0]! };
};

describe('simple protocol', () => {
  test("a read-only session's fence is one statement (read-only, then the no-PREPARE read) in a Query's plan", () => {
    const p = new Planner(readOnlySessionFence());
    const q = fencedQuery(p.plan(query('SELECT 1'), IDLE));
    expect(q.text).toBe(`${p.fence.text}SELECT 1`);
    expect(q.expect.plan).toEqual([true]);
  });

  test("at idle a Query gets the fence in front of it, and the fence statements' responses are swallowed", () => {
    const p = planner();
    const q = fencedQuery(p.plan(query('INSERT INTO t VALUES (1)'), IDLE));
    expect(q.text).toBe(`${p.fence.text}INSERT INTO t VALUES (1)`);
    expect(q.expect).toMatchObject({
      kind: 'query',
      injected: false,
      forwardReady: true,
      plan: [true],
      insertions: [{ start: 0, length: p.fence.chars }],
    });
  });

  test('inside a transaction a Query goes as it came, nothing injected', () => {
    // Still in the block at its ReadyForQuery (the relay checks).
    expect(planner().plan(query('INSERT INTO t VALUES (1)'), IN_BLOCK)).toEqual([
      { do: 'forward', expect: [{ kind: 'query', injected: false, forwardReady: true, at: 0, predict: 'T', mayCommit: false }] },
    ]);
  });

  test('in a failed transaction ROLLBACK goes through unfenced', () => {
    expect(sent(planner().plan(query('ROLLBACK'), FAILED))).toEqual(['writer']);
  });

  test('a lone BEGIN the proxy cannot answer itself (a comment in it) goes first and the fence right after it, so its isolation level applies', () => {
    const p = planner();
    const q = fencedQuery(p.plan(query('BEGIN /* batch */ ISOLATION LEVEL SERIALIZABLE'), IDLE));
    expect(q.text).toBe(`BEGIN /* batch */ ISOLATION LEVEL SERIALIZABLE\n;${p.fence.text}`);
    expect(q.expect.plan).toEqual([false, true]);
  });

  test('a plain lone BEGIN is answered by the proxy; it goes as a Query of its own in front of the next Query, which carries the proof in front of its text', () => {
    const p = planner();
    const held = p.plan(query('BEGIN ISOLATION LEVEL SERIALIZABLE'), IDLE);
    expect(held).toEqual([{ do: 'holdBegin', bytes: [message('C', cstr('BEGIN')), readyForQuery('T')] }]);
    expect(p.holdsBegin()).toBe(true);
    // The relay reports the block it told the writer of.
    const steps = p.plan(query('INSERT INTO t VALUES (1)'), IN_BLOCK);
    expect(sent(steps)).toEqual(['heldBegin', 'fencedQuery']);
    expect(steps[0]).toMatchObject({
      text: 'BEGIN ISOLATION LEVEL SERIALIZABLE',
      expect: [{ kind: 'query', injected: true, forwardReady: false }],
    });
    // The proof and the writer's statements in one Query: were the BEGIN to fail (a cancel's
    // signal may land on it), they would still run together, in one implicit transaction.
    const fenced = steps[1]!.do === 'send' ? steps[1]!.text : undefined;
    expect(fenced?.startsWith(p.fence.text)).toBe(true);
    expect(fenced?.endsWith('INSERT INTO t VALUES (1)')).toBe(true);
    expect(p.holdsBegin()).toBe(false);
    // Once: the block is open now, the next Query goes as it came.
    expect(sent(p.plan(query('COMMIT'), IN_BLOCK))).toEqual(['writer']);
  });

  test('START TRANSACTION is answered with its own tag; an extended group after a held BEGIN opens with it and the fence', () => {
    const p = planner();
    expect(p.plan(query('start transaction read write;'), IDLE)).toEqual([
      { do: 'holdBegin', bytes: [message('C', cstr('START TRANSACTION')), readyForQuery('T')] },
    ]);
    expect(group(p, IN_BLOCK, parse('INSERT INTO t VALUES ($1)'), bind(), execute(), sync)).toEqual([
      ['heldBegin', 'fence', 'writer'],
      ['writer'],
      ['writer'],
      ['writer'],
    ]);
  });

  test('a BEGIN is held only at idle with nothing owed, and never with anything after it', () => {
    expect(sent(planner().plan(query('BEGIN'), { status: 'I', awaiting: true }))).toEqual(['fencedQuery']);
    expect(sent(planner().plan(query('BEGIN; INSERT INTO t VALUES (1)'), IDLE))).toEqual(['fencedQuery']);
    expect(sent(planner().plan(query('BEGIN'), IN_BLOCK))).toEqual(['writer']);
  });

  test('a multi-statement Query with COMMIT in the middle gets a fence after the COMMIT too', () => {
    const p = planner();
    const q = fencedQuery(p.plan(query('INSERT INTO t VALUES (1); COMMIT; INSERT INTO t VALUES (2)'), IDLE));
    expect(q.text).toBe(`${p.fence.text}INSERT INTO t VALUES (1); COMMIT; ${p.fence.text}INSERT INTO t VALUES (2)`);
    // Statement by statement: fence, INSERT, COMMIT, fence, INSERT.
    expect(q.expect.plan).toEqual([true, false, false, true, false]);
  });

  test('COMMIT AND CHAIN as the last statement gets the fence right after it', () => {
    const p = planner();
    const q = fencedQuery(p.plan(query('COMMIT AND CHAIN'), IN_BLOCK));
    expect(q.text).toBe(`COMMIT AND CHAIN\n;${p.fence.text}`);
    expect(q.expect.plan).toEqual([false, true]);
  });

  test('a lone DISCARD or CHECKPOINT of a session without a fence goes unfenced, behind a swallowed reset of the read-only default', () => {
    for (const text of ['DISCARD ALL', 'CHECKPOINT']) {
      const steps = new Planner(readOnlySessionFence()).plan(query(text), IDLE);
      expect(steps).toEqual([
        {
          do: 'send',
          what: 'resetReadOnly',
          bytes: encode({ type: 'query', text: RESET_READ_ONLY_SQL }),
          expect: [{ kind: 'query', injected: true, forwardReady: false }],
        },
        { do: 'forward', expect: [{ kind: 'query', injected: false, forwardReady: true, predict: 'I', mayCommit: false }] },
      ]);
    }
  });

  test("a fenced session's lone DISCARD or CHECKPOINT goes as sent: its read-write default is the writer's", () => {
    for (const text of ['DISCARD ALL', 'CHECKPOINT']) expect(sent(planner().plan(query(text), IDLE))).toEqual(['writer']);
  });

  test('a multi-statement Query the parser refuses is refused by the proxy, nothing sent', () => {
    const steps = planner().plan(query('INSERT INTO t VALUES (1); COMMIT; SELEC'), IDLE);
    expect(sent(steps)).toEqual(['reply']);
    const reply = steps[0]!.do === 'reply' ? steps[0]!.bytes : [];
    expect(parseErrorFields(reply[0]!.subarray(5)).get('C')).toBe('42601');
    expect(reply[1]).toEqual(Buffer.from('Z\x00\x00\x00\x05I', 'latin1'));
  });

  test("behind responses still owed, a refusal waits in an empty Query of the proxy's", () => {
    const steps = planner().plan(query('INSERT INTO t VALUES (1); COMMIT; SELEC'), { status: 'I', awaiting: true });
    expect(sent(steps)).toEqual(['standIn']);
    expect(steps[0]).toMatchObject({
      bytes: encode({ type: 'query', text: '' }),
      expect: [{ kind: 'query', injected: true, forwardReady: false }],
    });
  });

  test('with standard_conforming_strings off a multi-statement Query with a transaction word and a backslash is refused (0A000)', () => {
    const p = planner();
    p.noteParameter('standard_conforming_strings', 'off');
    const steps = p.plan(query("SELECT '\\'; COMMIT"), IN_BLOCK);
    expect(steps[0]?.do === 'reply' && parseErrorFields(steps[0].bytes[0]!.subarray(5)).get('C')).toBe('0A000');
    // Without a backslash (or a character past ASCII) the server lexes it as the parser does: split.
    expect(p.plan(query('SELECT 1; COMMIT; SELECT 2'), IN_BLOCK)[0]?.do).toBe('send');
  });

  test('in SJIS a lone SET of fencepost.token goes unfenced only in ASCII', () => {
    const p = planner();
    p.noteParameter('client_encoding', 'SJIS');
    expect(p.plan(query('SET fencepost.token = 5'), IDLE)[0]?.do).toBe('forward');
    expect(p.plan(query("SET fencepost.fence_key = 'ソ'"), IDLE)[0]?.do).toBe('send');
  });
});

describe('extended protocol', () => {
  test('at idle a group gets the fence statements prepared (their own Sync) and the fence before its first message', () => {
    const p = planner();
    expect(group(p, IDLE, parse('INSERT INTO t VALUES (1)'), bind(), execute(), sync)).toEqual([
      ['fence', 'writer'],
      ['writer'],
      ['writer'],
      ['writer'],
    ]);
    // Prepared once per connection.
    expect(group(p, IDLE, parse('INSERT INTO t VALUES (2)'))).toEqual([['fence', 'writer']]);
  });

  test('what the proxy sends is swallowed: every expectation of the prepare and the fence is injected', () => {
    const steps = planner().plan(parse('SELECT 1'), IDLE);
    const ours = steps.filter((s) => s.do === 'send');
    expect(ours.flatMap((s) => s.expect).every((e) => e.injected)).toBe(true);
    expect(steps.at(-1)).toEqual({
      do: 'forward',
      expect: [{ kind: 'parse', injected: false, change: { of: 'statement', name: '', kind: 'other' } }],
    });
  });

  test("Parse/Bind/Execute of BEGIN gets the fence before the group's next message, after it when that is a SET of a fence setting", () => {
    expect(group(planner(), IDLE, parse('BEGIN'), bind(), execute(), parse('INSERT INTO t VALUES (1)'), sync)).toEqual([
      ['writer'],
      ['writer'],
      ['writer'],
      ['fence', 'writer'],
      ['writer'],
    ]);
    expect(
      group(
        planner(),
        IDLE,
        parse('BEGIN'),
        bind(),
        execute(),
        parse("SET fencepost.token = '7'"),
        bind(),
        execute(),
        parse('INSERT INTO t VALUES (1)'),
        sync,
      ),
    ).toEqual([['writer'], ['writer'], ['writer'], ['writer'], ['writer'], ['writer'], ['fence', 'writer'], ['writer']]);
  });

  test('BEGIN alone in its group (psycopg 3): the block owes the fence; a SET of a fence setting and COMMIT go without it, anything else gets it', () => {
    const p = planner();
    group(p, IDLE, parse('BEGIN'), bind(), execute(), sync);
    expect(sent(p.plan(query("SET fencepost.token = '7'"), IN_BLOCK))).toEqual(['writer']);
    expect(sent(p.plan(query('COMMIT'), IN_BLOCK))).toEqual(['writer']);
    const q = planner();
    group(q, IDLE, parse('BEGIN'), bind(), execute(), sync);
    expect(group(q, IN_BLOCK, parse('INSERT INTO t VALUES (1)'))).toEqual([['fence', 'writer']]);
  });

  test('after an Execute of COMMIT the fence comes before the next statement of the group', () => {
    const p = planner();
    p.plan(parse('INSERT INTO t VALUES (1)'), IDLE);
    expect(
      group(p, IDLE, bind(), execute(), parse('COMMIT', 'c'), bind('c', 'c'), execute('c'), parse('INSERT INTO t VALUES (2)'), sync),
    ).toEqual([['writer'], ['writer'], ['writer'], ['writer'], ['writer'], ['fence', 'writer'], ['writer']]);
  });

  test('COMMIT AND CHAIN gets the fence right after its Execute', () => {
    // The writer's unnamed statement may be bound again: the fence goes on the proxy's own name, closed after the Sync.
    expect(group(planner(), IN_BLOCK, parse('COMMIT AND CHAIN'), bind(), execute(), sync)).toEqual([
      ['writer'],
      ['writer'],
      ['writer', 'fence'],
      ['writer', 'closeOwn'],
    ]);
  });

  test('a CALL or DO executed outside a transaction block is refused by a failing statement before its Execute', () => {
    for (const text of ['CALL p()', 'DO $$BEGIN COMMIT; END$$']) {
      const steps = group(planner(), IDLE, parse(text), bind(), execute(), sync);
      expect(steps).toEqual([['fence', 'writer'], ['writer'], ['refuseRoutine', 'writer'], ['writer', 'closeOwn']]);
    }
  });

  test('inside a transaction block a CALL goes through', () => {
    expect(group(planner(), IN_BLOCK, parse('CALL p()'), bind(), execute(), sync)).toEqual([
      ['writer'],
      ['writer'],
      ['writer'],
      ['writer'],
    ]);
  });

  test('in a failed transaction a group is neither prepared for nor fenced: ROLLBACK goes through', () => {
    expect(group(planner(), FAILED, parse('ROLLBACK'), bind(), execute(), sync)).toEqual([['writer'], ['writer'], ['writer'], ['writer']]);
  });

  // Invariant: nothing of the proxy's stays in pg_prepared_statements, and the writer's own unnamed
  // statement is never replaced while the writer may still bind it.
  test('the fence is parsed on the unnamed statement once; later groups of named statements only bind it', () => {
    const p = planner();
    const first = fenceStep(p.plan(parse('INSERT INTO t VALUES (1)', 's1'), IDLE));
    expect(first).toEqual(['parse', 'bind', 'execute']);
    p.plan(bind('s1'), IDLE);
    p.plan(execute(), IDLE);
    p.plan(sync, IDLE);
    expect(fenceStep(p.plan(bind('s1'), IDLE))).toEqual(['bind', 'execute']);
  });

  test('pgbench -M prepared: a named plain BEGIN gets the fence in front, only bound (parsed when the statements were)', () => {
    const p = planner();
    for (const [name, text] of [
      ['b', 'BEGIN'],
      ['u', 'UPDATE t SET n = n + 1'],
      ['c', 'COMMIT'],
    ] as const) {
      p.plan(parse(text, name), IDLE);
      for (const step of p.plan(sync, IDLE)) if (step.do === 'forward') for (const e of step.expect) if (e.change) p.confirm(e.change);
    }
    for (let tx = 0; tx < 2; tx++) {
      expect(p.holdExtendedBegin([bind('b'), execute(), sync], IDLE)).toBeNull();
      expect(fenceStep(p.plan(bind('b'), IDLE))).toEqual(['bind', 'execute']);
      for (const m of [execute(), sync]) p.plan(m, IDLE);
      for (const name of ['u', 'c']) for (const m of [bind(name), execute(), sync]) expect(sent(p.plan(m, IN_BLOCK))).toEqual(['writer']);
    }
  });

  test("a writer's Parse of the unnamed statement replaces the fence: the next group parses it again, in front of its own Parse", () => {
    const p = planner();
    expect(group(p, IDLE, parse('INSERT INTO t VALUES (1)'), bind(), execute(), sync)).toEqual([
      ['fence', 'writer'],
      ['writer'],
      ['writer'],
      ['writer'],
    ]);
    expect(fenceStep(p.plan(parse('INSERT INTO t VALUES (2)'), IDLE))).toEqual(['parse', 'bind', 'execute']);
  });

  test("a group that binds the writer's unnamed statement parsed earlier gets the fence on the proxy's own name, closed after its Sync", () => {
    const p = planner();
    group(p, IDLE, parse('INSERT INTO t VALUES ($1)'), { type: 'describe', target: 'S', name: '' }, sync);
    const steps = p.plan(bind(), IDLE);
    expect(fenceStep(steps)).toEqual(['close', 'parse', 'bind', 'execute']);
    expect(sent(p.plan(execute(), IDLE))).toEqual(['writer']);
    expect(sent(p.plan(sync, IDLE))).toEqual(['writer', 'closeOwn']);
  });

  test("a Query drops the unnamed statement; so does a failed Parse of the proxy's: the fence is parsed again", () => {
    const p = planner();
    group(p, IDLE, parse('INSERT INTO t VALUES (1)', 's1'), bind('s1'), execute(), sync);
    p.plan(query('SELECT 1'), IDLE);
    expect(fenceStep(p.plan(bind('s1'), IDLE))).toEqual(['parse', 'bind', 'execute']);
    group(p, IDLE, execute(), sync);
    p.statementsDropped();
    expect(fenceStep(p.plan(bind('s1'), IDLE))).toEqual(['parse', 'bind', 'execute']);
  });
});

describe('what the planner believes', () => {
  test('a Query inside an open extended group whose BEGIN is still to be fenced ends the session, nothing of it sent', () => {
    const p = planner();
    p.plan(parse('BEGIN'), IDLE);
    expect(sent(p.plan(query('INSERT INTO t VALUES (1)'), IDLE))).toEqual(['fail']);
  });

  test("asyncpg: Parse/Describe/Flush, then a Query: the Query runs in the group's fenced transaction and ends the group", () => {
    const p = planner();
    expect(sent(p.plan(parse('INSERT INTO t VALUES ($1)', 's1'), IDLE))).toEqual(['fence', 'writer']);
    p.plan({ type: 'describe', target: 'S', name: 's1' }, IDLE);
    p.plan({ type: 'flush' }, IDLE);
    const steps = p.plan(query('BEGIN'), IDLE);
    expect(steps.map((x) => x.do)).not.toContain('fail');
    expect(steps.map((x) => x.do)).not.toContain('holdBegin'); // never answered by the proxy: it joins the group's transaction
    expect(p.inGroup()).toBe(false);
  });

  test('a group that opens with SET fencepost.token (pgJDBC) runs it unfenced; the fence comes before the next statement of the group', () => {
    const p = planner();
    expect(
      group(p, IDLE, parse("SET fencepost.token = '7'"), bind(), execute(), parse('INSERT INTO t VALUES (1)'), bind(), execute(), sync),
    ).toEqual([['writer'], ['writer'], ['writer'], ['fence', 'writer'], ['writer'], ['writer'], ['writer']]);
    // SET LOCAL is not a session's setting: fenced as any statement.
    expect(group(planner(), IDLE, parse("SET LOCAL fencepost.token = '7'"))).toEqual([['fence', 'writer']]);
  });

  test("a held BEGIN then SET fencepost.token goes unfenced; the block's COMMIT too, another statement gets the fence", () => {
    const p = planner();
    expect(sent(p.plan(query('BEGIN'), IDLE))).toEqual(['holdBegin']);
    expect(sent(p.plan(query("SET fencepost.token = '7'"), IDLE))).toEqual(['heldBegin', 'writer']);
    expect(sent(p.plan(query('COMMIT'), IN_BLOCK))).toEqual(['writer']);
    const q = planner();
    q.plan(query('BEGIN'), IDLE);
    q.plan(query("SET fencepost.token = '7'"), IDLE);
    expect(sent(q.plan(query('INSERT INTO t VALUES (1)'), IN_BLOCK))).toEqual(['proof', 'writer']);
    // A Query that needs a fence of its own after a COMMIT in it keeps the fence written into it.
    const r = planner();
    r.plan(query('BEGIN'), IDLE);
    r.plan(query("SET fencepost.token = '7'"), IDLE);
    expect(sent(r.plan(query('INSERT INTO t VALUES (1); COMMIT; INSERT INTO t VALUES (2)'), IN_BLOCK))).toEqual(['fencedQuery']);
  });

  test('a Query inside a group that opened in a block continues the block, unfenced', () => {
    const p = planner();
    p.plan(parse('INSERT INTO t VALUES ($1)', 's1'), IN_BLOCK);
    expect(sent(p.plan(query('COMMIT'), IDLE))).toEqual(['writer']);
  });

  test("a Parse the backend refused leaves the name's confirmed kind: its Execute is still fenced after, as a ROLLBACK", () => {
    const p = planner();
    const kinds = (steps: Step[]) => steps.flatMap((s) => (s.do === 'forward' ? s.expect : [])).map((e) => e.change);
    const first = kinds(p.plan(parse('ROLLBACK', 's1'), FAILED))[0]!;
    p.confirm(first);
    const second = kinds(p.plan(parse('SELECT 1', 's1'), FAILED))[0]!;
    p.discard(second); // refused: duplicate name
    p.plan(sync, FAILED);
    expect(group(p, FAILED, bind('s1'), execute(), parse('INSERT INTO t VALUES (1)'))).toEqual([
      ['writer'],
      ['writer'],
      ['fence', 'writer'],
    ]);
  });

  test('a Sync carries the predicted block state; a statement of unknown kind in a block leaves none', () => {
    const p = planner();
    const predict = (steps: Step[]) =>
      steps.at(-1)?.do === 'forward' ? (steps.at(-1) as { expect: { predict?: string }[] }).expect[0]!.predict : 'none';
    p.plan(parse('COMMIT'), IN_BLOCK);
    p.plan(bind(), IN_BLOCK);
    p.plan(execute(), IN_BLOCK);
    expect(predict(p.plan(sync, IN_BLOCK))).toBe('I');
    p.plan(bind('never-parsed'), IN_BLOCK);
    p.plan(execute(), IN_BLOCK);
    expect(predict(p.plan(sync, IN_BLOCK))).toBeUndefined();
  });
});

describe('whether a commit may be in flight (mayCommit: a backend lost before the ReadyForQuery answers 08007)', () => {
  /** The writer's sync/query expectation of these steps. */
  const writers = (steps: Step[]) =>
    steps
      .flatMap((s) => (s.do === 'forward' || s.do === 'send' ? s.expect : []))
      .filter((e) => !e.injected && (e.kind === 'query' || e.kind === 'sync'));
  const queryMayCommit = (text: string, ctx: PlanContext) => writers(planner().plan(query(text), ctx)).map((e) => e.mayCommit);

  test.each([
    ['INSERT INTO t VALUES (1)', IDLE, true], // an implicit transaction commits at its end
    ['BEGIN -- not held\n', IDLE, false],
    ['BEGIN; INSERT INTO t VALUES (1)', IDLE, false],
    ['BEGIN; INSERT INTO t VALUES (1); COMMIT', IDLE, true],
    ['INSERT INTO t VALUES (1)', IN_BLOCK, false],
    ['COMMIT', IN_BLOCK, true],
    ['END', IN_BLOCK, true],
    ['COMMIT AND CHAIN', IN_BLOCK, true],
    ['INSERT INTO t VALUES (1); COMMIT', IN_BLOCK, true],
    ['COMMIT', FAILED, false], // a failed block's COMMIT rolls back
    ['INSERT INTO t VALUES (1)', FAILED, false],
    ['ROLLBACK; INSERT INTO t VALUES (1)', FAILED, true],
    ['DISCARD ALL', IDLE, false], // unfenced, read-only: writes nothing
    ['', IDLE, false],
  ] as const)('%j from status %o: %s', (text, ctx, want) => {
    expect(queryMayCommit(text, ctx)).toEqual([want]);
  });

  test('extended protocol: an Execute outside a block commits at the Sync; inside one only an Execute of COMMIT may', () => {
    const mayCommit = (ctx: PlanContext, ...messages: ClientMessage[]) => {
      const p = planner();
      const steps = messages.flatMap((m) => p.plan(m, ctx));
      return writers(steps).map((e) => e.mayCommit);
    };
    expect(mayCommit(IDLE, parse('INSERT INTO t VALUES ($1)'), bind(), execute(), sync)).toEqual([true]);
    expect(mayCommit(IDLE, parse('BEGIN'), bind(), execute(), sync)).toEqual([false]);
    expect(mayCommit(IN_BLOCK, parse('INSERT INTO t VALUES ($1)'), bind(), execute(), sync)).toEqual([false]);
    expect(mayCommit(IN_BLOCK, parse('COMMIT'), bind(), execute(), sync)).toEqual([true]);
    expect(mayCommit(FAILED, parse('ROLLBACK'), bind(), execute(), sync)).toEqual([false]);
    expect(
      mayCommit(
        IN_BLOCK,
        parse('INSERT INTO t VALUES ($1)'),
        bind(),
        execute(),
        sync,
        parse('INSERT INTO t VALUES ($1)'),
        bind(),
        execute(),
        sync,
      ),
    ).toEqual([false, false]);
  });

  test('extended protocol in a block: the Execute of a COMMIT may commit before any Sync is sent', () => {
    const p = planner();
    const executes = [parse('COMMIT'), bind(), execute()]
      .flatMap((m) => p.plan(m, IN_BLOCK))
      .flatMap((s) => (s.do === 'forward' ? s.expect : []))
      .filter((e) => e.kind === 'execute');
    expect(executes).toEqual([{ kind: 'execute', injected: false, mayCommit: true }]);
    const q = planner();
    const insert = [parse('INSERT INTO t VALUES ($1)'), bind(), execute()]
      .flatMap((m) => q.plan(m, IN_BLOCK))
      .flatMap((s) => (s.do === 'forward' ? s.expect : []))
      .filter((e) => e.kind === 'execute');
    expect(insert).toEqual([{ kind: 'execute', injected: false }]);
  });
});

describe('other messages', () => {
  test('a FunctionCall is refused (0A000) with a ReadyForQuery of the last status, nothing sent', () => {
    const steps = planner().plan({ type: 'functionCall' }, IN_BLOCK);
    expect(sent(steps)).toEqual(['reply']);
    const reply = steps[0]!.do === 'reply' ? steps[0]!.bytes : [];
    expect(parseErrorFields(reply[0]!.subarray(5)).get('C')).toBe('0A000');
    expect(reply[1]).toEqual(Buffer.from('Z\x00\x00\x00\x05T', 'latin1'));
  });

  test('a message a client does not send after startup breaks the session', () => {
    expect(planner().plan({ type: 'other', code: 'p' }, IDLE)).toEqual([
      { do: 'fail', reason: 'unexpected message type "p" from the client' },
    ]);
  });
});

// Postgres tells prepared statements (and portals) apart by the first 63 bytes of their names as
// it stores them (NAMEDATALEN-1, cut byte-wise). Invariant: two names it keeps apart never share
// the planner's record, two it takes for one always do, and a held extended BEGIN sends the text
// recorded at its Parse, never the writer's Bind/Execute of a name.
describe('statement names as the server keys them', () => {
  /** A message as the relay reads it off the wire, `name` as raw bytes. */
  const wire = (type: string, ...parts: (Buffer | string | number)[]) => {
    const bytes = message(type, ...parts);
    return { msg: decodeClient({ type, bytes, body: bytes.subarray(5) }), bytes };
  };
  const z = Buffer.from([0]);
  const parseRaw = (name: Buffer, text: string) => wire('P', Buffer.concat([name, z]), text, int16(0));
  const bindRaw = (name: Buffer) => wire('B', '', Buffer.concat([name, z]), int16(0), int16(0), int16(0));
  const executeRaw = wire('E', '', int32(0));
  const syncRaw = wire('S');
  /** A group of the writer's, planned at idle, each Parse/Bind/Close confirmed by the backend. */
  const confirmed = (p: Planner, ...ms: { msg: ClientMessage }[]) => {
    for (const { msg } of ms)
      for (const step of p.plan(msg, IDLE)) if (step.do === 'forward') for (const e of step.expect) if (e.change) p.confirm(e.change);
  };
  /** A BEGIN with a mode: held when prepared under a name (a plain one is not). */
  const MODAL_BEGIN = 'BEGIN ISOLATION LEVEL REPEATABLE READ';
  const holds = (p: Planner, name: Buffer) => {
    const ms = [bindRaw(name), executeRaw, syncRaw];
    return p.holdExtendedBegin(
      ms.map((m) => m.msg),
      IDLE,
    );
  };

  test('a named plain BEGIN is not held: its group goes as sent, the fence in front; one with modes is held', () => {
    // Invariant: the fence comes before whatever the name holds by then (a DO block may have swapped it).
    const p = planner();
    confirmed(p, parseRaw(Buffer.from('b'), 'BEGIN'), syncRaw, parseRaw(Buffer.from('s'), 'START TRANSACTION'), syncRaw);
    for (const name of ['b', 's']) {
      expect(holds(p, Buffer.from(name))).toBeNull();
      expect(group(p, IDLE, bindRaw(Buffer.from(name)).msg, executeRaw.msg, syncRaw.msg)[0]).toEqual(['fence', 'writer']);
    }
    const q = planner();
    confirmed(q, parseRaw(Buffer.from('b'), MODAL_BEGIN), syncRaw, parseRaw(Buffer.alloc(0), 'BEGIN'), syncRaw);
    expect(holds(q, Buffer.from('b'))?.taken).toBe(3);
    // The unnamed statement, which only the protocol can make, is still held as a plain BEGIN.
    const r = planner();
    confirmed(r, parseRaw(Buffer.alloc(0), 'BEGIN'), syncRaw);
    expect(holds(r, Buffer.alloc(0))?.taken).toBe(3);
  });

  test('what a block owes ends with a ReadyForQuery outside a block (a group whose BEGIN failed set it at its Sync)', () => {
    const owes = (noteIdle: boolean) => {
      const p = planner();
      for (const m of [parse('BEGIN'), bind(), execute(), sync]) p.plan(m, IDLE);
      if (noteIdle) p.noteReady('I', false); // the Bind failed: the backend stayed idle
      return sent(p.plan(query('SELECT 2'), IN_BLOCK)); // a block opened later, unheld
    };
    expect(owes(false)).toEqual(['proof', 'writer']);
    expect(owes(true)).toEqual(['writer']);
  });

  test('a lone Sync while a BEGIN is held is answered in the block, nothing sent', () => {
    const p = planner();
    confirmed(p, parseRaw(Buffer.alloc(0), MODAL_BEGIN), syncRaw);
    expect(holds(p, Buffer.alloc(0))).not.toBeNull();
    expect(p.plan(syncRaw.msg, IN_BLOCK)).toEqual([{ do: 'reply', bytes: [readyForQuery('T')] }]);
    expect(p.holdsBegin()).toBe(true);
  });

  test('a Query drops the unnamed statement: a BEGIN parsed there is no longer answered by the proxy', () => {
    const [p, q] = [planner(), planner()];
    confirmed(p, parseRaw(Buffer.alloc(0), 'BEGIN'), syncRaw);
    confirmed(q, parseRaw(Buffer.alloc(0), 'BEGIN'), syncRaw);
    expect(holds(p, Buffer.alloc(0))).not.toBeNull();
    q.plan(query('SELECT 1'), IDLE);
    expect(holds(q, Buffer.alloc(0))).toBeNull(); // Postgres answers the Bind with 26000
  });

  test('names equal in their first 63 bytes are one statement: a Parse under either replaces the BEGIN', () => {
    for (const stem of [Buffer.from('a'.repeat(63)), Buffer.from(`${'a'.repeat(62)}é`)]) {
      const p = planner();
      const [X, Y] = [Buffer.concat([stem, Buffer.from('X')]), Buffer.concat([stem, Buffer.from('Y')])];
      confirmed(p, parseRaw(X, MODAL_BEGIN), syncRaw);
      expect(holds(p, Y)).not.toBeNull(); // the same statement to Postgres
      const q = planner();
      confirmed(q, parseRaw(X, MODAL_BEGIN), syncRaw, parseRaw(Y, 'INSERT INTO t VALUES (1)'), syncRaw);
      expect(holds(q, X)).toBeNull();
      expect(group(q, IDLE, bindRaw(X).msg, executeRaw.msg, syncRaw.msg)[0]).toEqual(['fence', 'writer']);
    }
  });

  test('names that are not UTF-8 stay apart (SQL_ASCII database): each keeps its own kind', () => {
    const p = planner();
    p.noteParameter('server_encoding', 'SQL_ASCII');
    p.noteParameter('client_encoding', 'SQL_ASCII');
    const [ff, fe] = [Buffer.from([0xff]), Buffer.from([0xfe])];
    confirmed(p, parseRaw(fe, 'INSERT INTO t VALUES (1)'), syncRaw, parseRaw(ff, MODAL_BEGIN), syncRaw);
    expect(holds(p, fe)).toBeNull(); // read as UTF-8 both are '\ufffd'
    expect(holds(p, ff)).not.toBeNull();
  });

  test('a name past ASCII that the server converts to its own encoding is never trusted', () => {
    const p = planner();
    p.noteParameter('server_encoding', 'UTF8');
    p.noteParameter('client_encoding', 'LATIN1');
    const e = Buffer.from([0x61, 0xe9]); // 'aé' in LATIN1: 3 bytes to the server
    confirmed(p, parseRaw(e, MODAL_BEGIN), syncRaw);
    expect(holds(p, e)).toBeNull();
    expect(group(p, IDLE, bindRaw(e).msg, executeRaw.msg, syncRaw.msg)[0]).toEqual(['fence', 'writer']);
    // ASCII names key alike either way.
    const q = planner();
    q.noteParameter('server_encoding', 'UTF8');
    q.noteParameter('client_encoding', 'LATIN1');
    confirmed(q, parseRaw(Buffer.from('b'), MODAL_BEGIN), syncRaw);
    expect(holds(q, Buffer.from('b'))).not.toBeNull();
  });

  test("DEALLOCATE in a Query forgets the statement under the parser's cut name", () => {
    const p = planner();
    const long = 'b'.repeat(66);
    confirmed(p, parseRaw(Buffer.from(long), MODAL_BEGIN), syncRaw);
    p.plan(query(`DEALLOCATE ${long}`), IDLE);
    expect(holds(p, Buffer.from(long))).toBeNull();
  });

  test("a held extended BEGIN is sent as the text of its Parse on the proxy's statement, never the writer's Bind/Execute", () => {
    const held = (steps: Step[]) => {
      const h = steps[0]!;
      if (h.do !== 'send' || h.what !== 'heldBegin') throw new Error(`not a held BEGIN: ${JSON.stringify(sent(steps))}`);
      return h;
    };
    const text = 'BEGIN ISOLATION LEVEL SERIALIZABLE';
    const p = planner();
    confirmed(p, parseRaw(Buffer.from('b'), text), syncRaw);
    expect(holds(p, Buffer.from('b'))?.taken).toBe(3);
    // Before a Query: on the unnamed statement (the Query drops it anyway), with a Sync of its own.
    const steps = p.plan(query('INSERT INTO t VALUES (1)'), IN_BLOCK);
    expect(sent(steps)).toEqual(['heldBegin', 'fencedQuery']);
    const parseBegin = encode({ type: 'parse', name: '', text, paramTypes: [] });
    const bindExecute = Buffer.concat([
      encode({ type: 'bind', portal: '', statement: '', values: [] }),
      encode({ type: 'execute', portal: '', maxRows: 0 }),
    ]);
    expect(held(steps).bytes).toEqual(Buffer.concat([parseBegin, bindExecute, encode({ type: 'sync' })]));
    expect(held(steps).expect.every((e) => e.injected && !e.forwardReady)).toBe(true);
    // Before a group that may bind the writer's unnamed statement: on the proxy's own, then the fence.
    const q = planner();
    confirmed(q, parseRaw(Buffer.alloc(0), 'SELECT 1'), syncRaw, parseRaw(Buffer.from('b'), text), syncRaw);
    expect(holds(q, Buffer.from('b'))).not.toBeNull();
    const first = q.plan(bind(), IN_BLOCK);
    expect(sent(first)).toEqual(['heldBegin', 'fence', 'writer']);
    expect(held(first).expect.map((e) => e.kind)).toEqual(['close', 'parse', 'bind', 'execute']);
    expect(held(first).bytes.includes(Buffer.from(text))).toBe(true);
    expect(held(first).bytes.includes(Buffer.from('\0b\0'))).toBe(false);
  });

  test('a Bind with parameters, or of a BEGIN parsed with parameter types, is not answered by the proxy', () => {
    const p = planner();
    confirmed(p, parseRaw(Buffer.from('b'), MODAL_BEGIN), syncRaw);
    const withParam = wire('B', '', 'b', int16(0), int16(1), int32(1), Buffer.from('1'), int16(0));
    expect(p.holdExtendedBegin([withParam.msg, executeRaw.msg, syncRaw.msg], IDLE)).toBeNull();
    confirmed(p, wire('P', 'c', 'BEGIN', int16(1), int32(23)));
    p.plan(syncRaw.msg, IDLE);
    expect(holds(p, Buffer.from('c'))).toBeNull();
  });

  test('only the unnamed statement is trusted as a SET of a fence setting opening a group unfenced', () => {
    const p = planner();
    confirmed(p, parseRaw(Buffer.from('tok'), "SET fencepost.token = '7'"), syncRaw);
    expect(group(p, IDLE, bindRaw(Buffer.from('tok')).msg, executeRaw.msg, syncRaw.msg)[0]).toEqual(['fence', 'writer']);
    const q = planner();
    confirmed(q, parseRaw(Buffer.alloc(0), "SET fencepost.token = '7'"), syncRaw);
    expect(group(q, IDLE, bindRaw(Buffer.alloc(0)).msg, executeRaw.msg, syncRaw.msg)).toEqual([['writer'], ['writer'], ['writer']]);
  });
});
