// Typed messages of the SQL door's framing: the frontend messages the proxy sends are the bytes the
// protocol frames them as, and the client messages the planner reads decode as leniently as they
// are forwarded (the backend refuses a malformed one).
import { describe, expect, test } from 'vitest';
import { cstr, int16, int32, message, type Frame } from '../../../src/proxy/sql/wire/framing.ts';
import { decodeClient, encode } from '../../../src/proxy/sql/wire/frontend.ts';

const frame = (bytes: Buffer): Frame => ({ type: String.fromCharCode(bytes[0]!), bytes, body: bytes.subarray(5) });

describe('encode', () => {
  test('each frontend message the proxy sends is the bytes of its protocol framing', () => {
    const text = Buffer.from('ab', 'utf8');
    expect(encode({ type: 'query', text: 'SELECT é' })).toEqual(message('Q', 'SELECT é'));
    expect(encode({ type: 'parse', name: 's', text: 'SELECT $1', paramTypes: [25] })).toEqual(
      message('P', 's', 'SELECT $1', int16(1), int32(25)),
    );
    expect(encode({ type: 'bind', portal: '', statement: 's', values: ['ab', null] })).toEqual(
      message('B', cstr(''), 's', int16(0), int16(2), int32(2), text, int32(-1), int16(0)),
    );
    expect(encode({ type: 'execute', portal: '', maxRows: 0 })).toEqual(message('E', cstr(''), int32(0)));
    expect(encode({ type: 'close', target: 'S', name: 's' })).toEqual(message('C', Buffer.from('S'), 's'));
    expect(encode({ type: 'sync' })).toEqual(message('S'));
  });
});

describe('decodeClient', () => {
  test('Query, Parse, Bind and Execute decode to their fields', () => {
    expect(decodeClient(frame(message('Q', 'SELECT 1')))).toMatchObject({ type: 'query', text: 'SELECT 1', raw: Buffer.from('SELECT 1') });
    expect(decodeClient(frame(message('P', 's', 'SELECT $1', int16(1), int32(25))))).toMatchObject({
      type: 'parse',
      name: 's',
      nameBytes: Buffer.from('s'),
      text: 'SELECT $1',
      paramTypes: [25],
    });
    expect(decodeClient(frame(message('B', 'p', 's', int16(0), int16(0), int16(0))))).toMatchObject({
      type: 'bind',
      portal: 'p',
      statement: 's',
      portalBytes: Buffer.from('p'),
      statementBytes: Buffer.from('s'),
      paramFormats: 0,
      paramCount: 0,
    });
    expect(decodeClient(frame(message('B', '', 's', int16(1), int16(0), int16(1), int32(1), Buffer.from('7'), int16(0))))).toMatchObject({
      paramFormats: 1,
      paramCount: 1,
    });
    expect(decodeClient(frame(message('E', 'p', int32(5))))).toMatchObject({
      type: 'execute',
      portal: 'p',
      portalBytes: Buffer.from('p'),
      maxRows: 5,
    });
    // Names as sent: bytes that are not UTF-8 read alike as text, never as bytes.
    const odd = decodeClient(frame(message('C', Buffer.from('S'), Buffer.from([0xff, 0x61, 0]))));
    expect(odd).toMatchObject({ type: 'close', target: 'S', name: '\ufffda', nameBytes: Buffer.from([0xff, 0x61]) });
  });

  test("a string missing its NUL reads as '', a short list as far as it goes", () => {
    expect(decodeClient(frame(message('Q', Buffer.from('SELECT 1'))))).toMatchObject({ type: 'query', text: '', raw: Buffer.alloc(0) });
    expect(decodeClient(frame(message('P', 's', 'SELECT $1', int16(3), int32(25))))).toMatchObject({
      type: 'parse',
      name: 's',
      nameBytes: Buffer.from('s'),
      text: 'SELECT $1',
      paramTypes: [25],
    });
    expect(decodeClient(frame(message('E', 'p')))).toMatchObject({
      type: 'execute',
      portal: 'p',
      portalBytes: Buffer.from('p'),
      maxRows: 0,
    });
    expect(decodeClient(frame(message('E', Buffer.from('p'))))).toMatchObject({
      type: 'execute',
      portal: '',
      portalBytes: Buffer.alloc(0),
      maxRows: 0,
    });
  });
});
