// fenceRefusal on what a running proxy answers (node-postgres through the SQL endpoint, revoked and
// refused at connect; the HTTP door's body and ProxyClient's StaleTokenError), and on shapes built
// here: each wrapper, Prisma's, a cycle, and what it must not take for a refusal. Every library's
// own errors through the endpoint are test/orms/orms.test.ts's (project system).
import { describe, expect, test } from 'vitest';
import { fenceRefusal, ProxyClient, StaleTokenError } from '../../src/writer/index.ts';
import { STALE_TOKEN } from '../../src/fence/index.ts';
import { staleDetailText, unverifiedDetailText } from '../../src/proxy/sql/fencer.ts';
import { ERRORS } from '../../src/proxy/errors.ts';
import { sqlTest } from '../support/fixtures.ts';
import { fenceOptions, raiseFence } from '../support/sql.ts';

const detail = 'fence key "orders/eu", token 7, highest token 9';
const pgError = () => Object.assign(new Error('stale fencing token: …'), { code: 'FP409', severity: 'ERROR', detail });
const expected = { code: 'FP409', fenceKey: 'orders/eu', token: 7n, highestToken: 9n };

describe('fenceRefusal on a running proxy', () => {
  const fenceKey = 'refusal/orders';

  sqlTest("node-postgres: a newer leader's raise, then the old token at connect", async ({ sql }) => {
    const old = await sql.connect('old-leader', { options: fenceOptions(3, fenceKey) });
    let revoked: unknown = null;
    try {
      await raiseFence(sql, fenceKey, 4);
      revoked = await old.query('SELECT 1').then(
        () => null,
        (err: unknown) => err,
      );
    } finally {
      await old.end().catch(() => {});
    }
    const refusal = { code: 'FP409', fenceKey, token: 3n, highestToken: 4n };
    expect(fenceRefusal(revoked)).toEqual(refusal);
    const atConnect = await sql.connect('old-leader', { options: fenceOptions(3, fenceKey) }).then(
      (c) => c.end(),
      (err: unknown) => err,
    );
    expect(fenceRefusal(atConnect)).toEqual(refusal);
  });

  sqlTest("the HTTP door: the stale write's JSON body, and ProxyClient's StaleTokenError", async ({ sql }) => {
    const fenceKey = 'refusal/http';
    await raiseFence(sql, fenceKey, 4);
    const res = await fetch(`${sql.proxy.url}/v1/objects/refusal%2F1`, {
      method: 'PUT',
      headers: { 'fencing-token': '3', 'fence-key': fenceKey },
      body: 'x',
    });
    expect(res.status).toBe(409);
    const http = { code: 'stale_token', fenceKey, token: 3n, highestToken: 4n };
    expect(fenceRefusal(await res.json())).toEqual(http);
    const thrown = await new ProxyClient(sql.proxy.url).put('refusal/1', 'x', { token: 3n, fenceKey }).then(
      () => null,
      (err: unknown) => err,
    );
    expect(thrown).toBeInstanceOf(StaleTokenError);
    expect(fenceRefusal(thrown)).toEqual(http);
  });
});

// fenceRefusal reads the wire without importing the fence: these keep the two in step.
describe("fenceRefusal and the fence's own formats", () => {
  test("reads the DETAIL the proxy writes, stale and unverified, whatever the fence key's characters", () => {
    for (const fenceKey of ['orders', 'a "quoted", key\\', 'ключ/é', 'token 1, highest token 2']) {
      expect(fenceRefusal({ code: STALE_TOKEN, detail: staleDetailText(fenceKey, 5n, 6n) })).toEqual({
        code: 'FP409',
        fenceKey,
        token: 5n,
        highestToken: 6n,
      });
      expect(fenceRefusal({ code: STALE_TOKEN, detail: unverifiedDetailText(fenceKey, 5n, null) })).toEqual({
        code: 'FP409',
        fenceKey,
        token: 5n,
        highestToken: null,
      });
    }
  });

  test("its codes are the fence's and the HTTP registry's", () => {
    expect(STALE_TOKEN).toBe('FP409');
    expect(ERRORS.stale_token.status).toBe(409);
  });
});

describe('fenceRefusal', () => {
  test("reads the fence key, token and highest token from an FP409's DETAIL", () => {
    expect(fenceRefusal(pgError())).toEqual(expected);
  });

  test('finds the refusal wrapped as cause, parent, original or driverError', () => {
    for (const key of ['cause', 'parent', 'original', 'driverError']) {
      expect(fenceRefusal(Object.assign(new Error('wrapped'), { code: 'WRAPPER', [key]: pgError() }))).toEqual(expected);
    }
  });

  test("finds it in Prisma's P2039 under meta.driverAdapterError.cause, by originalCode", () => {
    // What @prisma/adapter-pg 7's convertDriverError makes of a pg error with an unmapped code, wrapped
    // by the client as a PrismaClientKnownRequestError.
    const cause = {
      originalCode: 'FP409',
      originalMessage: 'stale fencing token: …',
      kind: 'postgres',
      code: 'FP409',
      severity: 'ERROR',
      detail,
    };
    const err = Object.assign(new Error('Invalid `prisma.row.create()` invocation'), {
      code: 'P2039',
      clientVersion: '7.10.0',
      meta: { modelName: 'row', driverAdapterError: Object.assign(new Error('postgres'), { name: 'DriverAdapterError', cause }) },
    });
    expect(fenceRefusal(err)).toEqual(expected);
  });

  test('an unverified token: the same fields behind the forgery guard’s prefix, and no highest token on a fence never raised', () => {
    const err = { code: 'FP409', detail: 'unverified token: fence key "orders/eu", token 7, highest token ' };
    expect(fenceRefusal(err)).toEqual({ code: 'FP409', fenceKey: 'orders/eu', token: 7n, highestToken: null });
  });

  test('an FP409 that lost its DETAIL is still a refusal, with its numbers unknown', () => {
    expect(fenceRefusal({ code: 'FP409', message: 'stale fencing token' })).toEqual({
      code: 'FP409',
      fenceKey: null,
      token: null,
      highestToken: null,
    });
  });

  test("the HTTP door's JSON body and ProxyClient's StaleTokenError", () => {
    const body = { error: 'stale_token', message: '…', fenceKey: 'orders', token: '41', highestToken: '42' };
    const http = { code: 'stale_token', fenceKey: 'orders', token: 41n, highestToken: 42n };
    expect(fenceRefusal(body)).toEqual(http);
    expect(fenceRefusal(new StaleTokenError(409, body))).toEqual(http);
  });

  test('other errors are not refusals: another SQLSTATE, another HTTP code, non-objects', () => {
    for (const err of [
      Object.assign(new Error('read-only'), { code: '25006', detail }),
      { code: 'FP403', detail },
      { error: 'token_required', fenceKey: 'orders' },
      new Error('FP409'),
      'FP409',
      null,
      undefined,
      42,
    ]) {
      expect(fenceRefusal(err)).toBeNull();
    }
  });

  test('a cycle of wrappers ends, and a refusal wrapped deeper than the bound is not looked for', () => {
    const a: Record<string, unknown> = { code: 'A' };
    const b: Record<string, unknown> = { code: 'B', cause: a };
    a.parent = b;
    expect(fenceRefusal(a)).toBeNull();
    let deep: Record<string, unknown> = pgError() as unknown as Record<string, unknown>;
    for (let i = 0; i < 6; i++) deep = { cause: deep };
    expect(fenceRefusal(deep)).toEqual(expected);
    expect(fenceRefusal({ cause: deep })).toBeNull();
  });
});
