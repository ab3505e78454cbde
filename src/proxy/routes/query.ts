import { ApiError } from '../errors.ts';

export const MAX_PAGE = 1000;

/** `?limit=`: 1…1000, default `def`. */
export function parseLimit(raw: unknown, def: number): number {
  if (raw === undefined) return def;
  if (typeof raw !== 'string' || !/^\d{1,4}$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_PAGE) {
    throw new ApiError('invalid_query', `limit must be a whole number from 1 to ${MAX_PAGE}`);
  }
  return Number(raw);
}
