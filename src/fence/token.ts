// Fencing tokens: 64-bit, kept as bigint in code and as decimal strings on the wire.

export const MAX_TOKEN = 9223372036854775807n; // Postgres bigint max

export type TokenParse = { ok: true; token: bigint } | { ok: false; reason: 'missing' | 'invalid' };

/**
 * Parses a `Fencing-Token` header: decimal digits only, leading zeros allowed (so a ZooKeeper
 * sequence suffix like `0000000042` works as-is), 0 … 2^63-1. Signs, exponents, hex and
 * whitespace are invalid.
 */
export function parseToken(raw: string | string[] | undefined): TokenParse {
  if (raw === undefined) return { ok: false, reason: 'missing' };
  if (typeof raw !== 'string' || !/^[0-9]+$/.test(raw)) return { ok: false, reason: 'invalid' };
  const digits = raw.replace(/^0+(?=.)/, '');
  if (digits.length > 19) return { ok: false, reason: 'invalid' };
  const token = BigInt(digits);
  if (token > MAX_TOKEN) return { ok: false, reason: 'invalid' };
  return { ok: true, token };
}
