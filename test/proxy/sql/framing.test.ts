// The SQL endpoint's own pieces, without a database: framing, SCRAM, startup options, the stale
// refusal's detail, config.
import { describe, expect, test } from 'vitest';
import { MessageReader, FramingError, Outbox, bodyByte, message, nulAt } from '../../../src/proxy/sql/wire/framing.ts';
import { commandTag, frameTag } from '../../../src/proxy/sql/wire/backend.ts';
import { randomBytes } from 'node:crypto';
import { ScramClient, ScramServer, mockScramSecret, scramSecret } from '../../../src/proxy/access/scram.ts';
import { parseOptions } from '../../../src/proxy/sql/startup.ts';
import { staleDetailText } from '../../../src/proxy/sql/fencer.ts';
import { loadConfig } from '../../../src/proxy/config.ts';

describe('framing', () => {
  test('a chunk holding several messages, and a message split over chunks, frame exactly', () => {
    const a = message('Q', 'SELECT 1');
    const b = message('S');
    const c = message('P', 'stmt', 'SELECT $1', Buffer.from([0, 0]));
    const all = Buffer.concat([a, b, c]);
    const r = new MessageReader();
    r.push(all.subarray(0, a.length + b.length + 3));
    expect([r.next()?.type, r.next()?.type, r.next()]).toEqual(['Q', 'S', null]);
    r.push(all.subarray(a.length + b.length + 3));
    const f = r.next()!;
    expect([f.type, f.bytes.equals(c), r.next(), r.pending]).toEqual(['P', true, null, 0]);
  });

  test('frames read from every split of a stream keep their bytes, body, tag and status byte', () => {
    // Invariant: however the stream is cut into reads, each frame is exactly the bytes of its message.
    const ms = [message('C', 'INSERT 0 1'), message('Z', Buffer.from('T')), message('C', 'SELECT 1'), message('Z', Buffer.from('I'))];
    const all = Buffer.concat(ms);
    for (let cut = 0; cut <= all.length; cut++) {
      for (const step of [1, 3, 7, all.length]) {
        const r = new MessageReader();
        r.push(all.subarray(0, cut));
        for (let at = cut; at < all.length; at += step) r.push(all.subarray(at, Math.min(all.length, at + step)));
        const got = ms.map(() => r.next()!);
        expect(r.next()).toBeNull();
        expect(got.map((f) => f.bytes.equals(ms[got.indexOf(f)]!))).toEqual([true, true, true, true]);
        expect(got.map((f) => (f.type === 'C' ? frameTag(f) : String.fromCharCode(bodyByte(f, 0)!)))).toEqual([
          'INSERT 0 1',
          'T',
          'SELECT 1',
          'I',
        ]);
        expect(got.map((f) => f.body.length)).toEqual(ms.map((m) => m.length - 5));
        expect(bodyByte(got[1]!, 1)).toBeUndefined();
      }
    }
  });

  test('an Outbox writes frames and buffers in the order given; a run of one chunk is a view of it, a gap breaks the run', () => {
    const ms = [message('2'), message('C', 'SELECT 1'), message('2'), message('C', 'UPDATE 1'), message('Z', Buffer.from('I'))];
    const chunk = Buffer.concat(ms);
    const r = new MessageReader();
    r.push(chunk);
    const f = ms.map(() => r.next()!);
    const o = new Outbox();
    expect([o.empty, o.take()]).toEqual([true, null]);
    // The first two left out, the rest forwarded: one view of the chunk.
    for (const x of f.slice(2)) o.frame(x);
    const run = o.take()!;
    expect(run.equals(Buffer.concat(ms.slice(2)))).toBe(true);
    expect(run.buffer).toBe(chunk.buffer);
    // A frame skipped in the middle, and a buffer of the proxy's in between: order kept, nothing skipped sent.
    const own = message('E', 'ours');
    o.frame(f[0]!);
    o.push(own);
    o.frame(f[1]!);
    o.frame(f[3]!);
    o.frame(f[4]!);
    o.pushAll([message('S')]);
    expect(o.empty).toBe(false);
    expect(o.take()!.equals(Buffer.concat([ms[0]!, own, ms[1]!, ms[3]!, ms[4]!, message('S')]))).toBe(true);
    expect(o.empty).toBe(true);
  });

  test('nulAt finds the first NUL before the limit, past the short-string loop too; commandTag reads up to it', () => {
    const long = Buffer.concat([Buffer.alloc(100, 0x61), Buffer.from([0]), Buffer.from('b'), Buffer.from([0])]);
    expect([nulAt(long, 0), nulAt(long, 101), nulAt(long, 0, 100), nulAt(long, 102, 102)]).toEqual([100, 102, -1, -1]);
    expect([commandTag(Buffer.from('COMMIT\0')), commandTag(Buffer.from('COMMIT')), commandTag(Buffer.from([0]))]).toEqual([
      'COMMIT',
      '',
      '',
    ]);
  });

  test('drain hands over the bytes not yet framed, as they came, from where framing stopped; the reader is empty after', () => {
    // What a writer sent behind its startup packet goes to the backend as sent (relay.ts start).
    const q = message('Q', 'SELECT 1');
    const s = message('S');
    const r = new MessageReader();
    r.push(Buffer.concat([q, s.subarray(0, 2)]));
    r.push(s.subarray(2));
    expect(r.next()?.type).toBe('Q');
    expect(Buffer.concat(r.drain()).equals(s)).toBe(true);
    expect([r.pending, r.next(), r.drain()]).toEqual([0, null, []]);
  });

  test('a length below 4 or past the limit is refused', () => {
    const r = new MessageReader();
    r.push(Buffer.from([0x51, 0, 0, 0, 2]));
    expect(() => r.next()).toThrow(FramingError);
    const s = new MessageReader(true);
    s.push(Buffer.from([0x7f, 0, 0, 0]));
    expect(() => s.next()).toThrow(FramingError);
  });
});

describe('SCRAM-SHA-256', () => {
  test('the right password passes both ways; a wrong one or an unknown user fails', async () => {
    const exchange = async (secret: ReturnType<typeof scramSecret>, known: boolean, password: string) => {
      const server = new ScramServer(secret, known);
      const client = new ScramClient(password);
      const final = await client.final(server.first(client.first()));
      client.verify(server.final(final));
    };
    const secret = scramSecret('the-bearer-key-0123');
    await expect(exchange(secret, true, 'the-bearer-key-0123')).resolves.toBeUndefined();
    await expect(exchange(secret, true, 'another-key-0123456')).rejects.toThrow(/password authentication failed/);
    await expect(exchange(mockScramSecret(randomBytes(32), 'nobody'), false, 'the-bearer-key-0123')).rejects.toThrow(
      /password authentication failed/,
    );
  });
});

describe('startup options and the stale detail', () => {
  test('options: -c pairs, --name=value and escaped spaces', () => {
    expect(parseOptions('-c fencepost.token=42 -cfencepost.fence_key=a\\ b --statement-timeout=5')).toEqual(
      new Map([
        ['fencepost.token', '42'],
        ['fencepost.fence_key', 'a b'],
        ['statement_timeout', '5'],
      ]),
    );
  });

  test("a stale refusal's detail names its fence key (as JSON), token and highest token in one fixed form", () => {
    // The DETAIL of an FP409 refusal: at startup (fencer.ts refusalFields) and when a raise ends the connection (revokedFields).
    expect(staleDetailText('a "b"', 4n, 5n)).toBe('fence key "a \\"b\\"", token 4, highest token 5');
    expect(staleDetailText('k', 4n, null)).toBe('fence key "k", token 4, highest token ');
  });
});

describe('configuration', () => {
  test('the SQL endpoint is off unless FENCEPOST_PGWIRE_PORT is set', () => {
    expect(loadConfig({}).pgwirePort).toBeNull();
    expect(loadConfig({ FENCEPOST_PGWIRE_PORT: '6432' }).pgwirePort).toBe(6432);
  });

  test('FENCEPOST_PG_PORT is refused, naming FENCEPOST_EMBEDDED_PG_PORT', () => {
    expect(() => loadConfig({ FENCEPOST_PG_PORT: '5555' })).toThrow(/FENCEPOST_EMBEDDED_PG_PORT/);
    expect(loadConfig({ FENCEPOST_EMBEDDED_PG_PORT: '5555' }).embeddedPgPort).toBe(5555);
  });

  test('the SQL endpoint with the forgery guard is accepted (the guard runs there: test/proxy/sql/forgery-guard.test.ts)', () => {
    const env = { FENCEPOST_PGWIRE_PORT: '6432', FENCEPOST_FORGERY_GUARD: '{"a/": "/e"}', ZK_CONNECT: 'zk:2181', ZK_AUTH: 'u:p' };
    const config = loadConfig(env);
    expect(config.pgwirePort).toBe(6432);
    expect(config.forgeryGuard?.mappings).toEqual([{ prefix: 'a/', electionPath: '/e' }]);
  });
});
