// Query parameters shared by the list routes, as schema properties (src/proxy/http/validation.ts).

export const MAX_PAGE = 1000;
export const DEFAULT_PAGE = 100;

/**
 * `?limit=`: 1…1000 in at most four decimal digits, leading zeros allowed (no sign, space or
 * exponent). test/proxy/validation.test.ts checks the pattern against every such string.
 */
export const LIMIT = {
  type: 'string',
  pattern: '^(?:0{0,3}[1-9]|0{0,2}[1-9][0-9]|0?[1-9][0-9]{2}|1000)$',
  description: `a whole number from 1 to ${MAX_PAGE}`,
} as const;

/** A validated `?limit=`, or the default. */
export function pageLimit(raw: string | undefined): number {
  return raw === undefined ? DEFAULT_PAGE : Number(raw);
}
