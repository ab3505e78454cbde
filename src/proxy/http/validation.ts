// Request validation: routes declare fastify schemas for bodies, querystrings, params and headers;
// fastify validates with Ajv before the handler runs, and a failure becomes a registry error here.
// Ajv stops at the first failure (allErrors stays off: the cost of a hostile request is bounded),
// so one failure decides the answer.
import type { FastifySchemaValidationError } from 'fastify';
import { keyProblem, parseToken } from '../../fence/index.ts';
import { ApiError, type ErrorCode } from '../errors.ts';

/** fastify's name for the part of the request a schema failed on. */
export type RequestPart = 'body' | 'headers' | 'params' | 'querystring';

const MAX_BIGSERIAL = 9223372036854775807n;

/**
 * fastify's Ajv (its `ajv` option), changed in three ways:
 * - no type coercion: `{"token": 5}` is not a token, and a repeated query parameter (an array)
 *   is refused, not read as one of its values;
 * - `additionalProperties: false` refuses an unknown field instead of silently dropping it;
 * - errors carry the failing schema and value (`verbose`), for the messages below.
 * Formats name the proxy's own rules, so a schema checks exactly what the code means.
 */
export const AJV_OPTIONS = {
  customOptions: {
    coerceTypes: false,
    removeAdditional: false,
    verbose: true,
    formats: {
      /** An object or fence key: src/fence/key.ts. */
      'fencepost-key': (s: string) => keyProblem(s) === null,
      /** A fencing token: src/fence/token.ts (digits, 0…2^63−1, leading zeros allowed). */
      'fencing-token': (s: string) => parseToken(s).ok,
      /** A key prefix (GET /v1/objects?prefix=): empty, or what a key may be. */
      'fencepost-key-prefix': (s: string) => s === '' || keyProblem(s) === null,
      /** A rejection id (bigserial): 1…2^63−1 in at most 19 digits. */
      'rejection-id': (s: string) => /^[0-9]{1,19}$/.test(s) && BigInt(s) >= 1n && BigInt(s) <= MAX_BIGSERIAL,
    },
  },
};

/**
 * Keys in paths, query parameters and transaction bodies. (The Fence-Key header arrives as raw
 * bytes: request.ts decodes and checks it.)
 */
export const KEY = {
  type: 'string',
  format: 'fencepost-key',
  description: 'a key: 1 to 1024 bytes of UTF-8 without control characters',
} as const;

/** Tokens, in the Fencing-Token header and in transaction bodies (JSON strings, never numbers). */
export const TOKEN = {
  type: 'string',
  pattern: '^[0-9]+$',
  format: 'fencing-token',
  description: 'decimal digits in 0…9223372036854775807',
} as const;

/** Routes that take no query parameters still refuse unknown ones. (`properties: {}`: OpenAPI lists none.) */
export const NO_QUERY = { type: 'object', additionalProperties: false, properties: {} } as const;

/** `Writer-Id`, kept in the rejection log (request.ts strips control characters and caps it). */
export const WRITER_ID = {
  type: 'string',
  description: 'who sent the write, kept in the rejection log (at most 200 characters are kept)',
} as const;

/** The headers of a fenced write. Other headers pass: a request carries many. */
export const FENCED_HEADERS = {
  type: 'object',
  required: ['fencing-token'],
  properties: { 'fencing-token': TOKEN, 'writer-id': WRITER_ID },
} as const;

/** Params of `/…/:name` routes whose parameter is a key. */
export function keyParams(name: string) {
  return { type: 'object', required: [name], additionalProperties: false, properties: { [name]: KEY } } as const;
}

/** What Ajv reports with `verbose`: the schema holding the failing keyword and the value it saw. */
interface SchemaNode {
  description?: string;
  format?: string;
  properties?: Record<string, SchemaNode>;
}
type AjvError = FastifySchemaValidationError & { parentSchema?: SchemaNode; data?: unknown };

const isToken = (s: SchemaNode | undefined) => s?.format === TOKEN.format;

/** Where a failure is, in words: `Fencing-Token header`, `query parameter limit`, `fence key`, `fences[0].token`. */
function label(part: RequestPart, path: string): string {
  const steps = path.split('/').slice(1);
  const first = steps[0];
  if (first === undefined) return part === 'querystring' ? 'the query' : `the ${part}`;
  if (part === 'headers') return `${first.replace(/(^|-)([a-z])/g, (_m, dash: string, c: string) => dash + c.toUpperCase())} header`;
  if (part === 'querystring') return `query parameter ${first}`;
  // `*`: the object key of /v1/objects/*, which may hold `/`.
  if (part === 'params') return first === '*' ? 'key' : first.replace(/[A-Z]/g, (c) => ` ${c.toLowerCase()}`);
  return steps.map((s, i) => (/^[0-9]+$/.test(s) ? `[${s}]` : i === 0 ? s : `.${s}`)).join('');
}

/**
 * The registry error for a schema failure. Keys (format fencepost-key) are `invalid_key` and
 * tokens `invalid_token` (`token_required` when missing) wherever they appear; anything else about
 * this part of the request is `fallback`.
 */
export function registryError(errors: FastifySchemaValidationError[], part: RequestPart, fallback: ErrorCode): ApiError {
  const e = errors[0] as AjvError | undefined;
  if (e === undefined) return new ApiError(fallback, `the ${part} is not valid`);
  if (e.keyword === 'required') {
    const field = String(e.params.missingProperty);
    const where = label(part, `${e.instancePath}/${field}`);
    return new ApiError(isToken(e.parentSchema?.properties?.[field]) ? 'token_required' : fallback, `${where} is missing`);
  }
  if (e.keyword === 'additionalProperties') {
    const field = JSON.stringify(String(e.params.additionalProperty).slice(0, 100));
    return new ApiError(
      fallback,
      part === 'querystring' ? `unknown query parameter ${field}` : `${label(part, e.instancePath)} has an unknown field ${field}`,
    );
  }
  const where = label(part, e.instancePath);
  if (e.keyword === 'format' && e.params.format === KEY.format)
    return new ApiError('invalid_key', `${where} ${keyProblem(String(e.data))}`);
  const code = isToken(e.parentSchema) ? 'invalid_token' : fallback;
  if (part === 'querystring' && Array.isArray(e.data)) return new ApiError(code, `${where} is given more than once`);
  const description = e.parentSchema?.description;
  return new ApiError(code, description === undefined ? `${where} ${e.message ?? 'is not valid'}` : `${where} must be ${description}`);
}

const FALLBACK: Record<RequestPart, ErrorCode> = {
  querystring: 'invalid_query',
  params: 'invalid_key',
  headers: 'bad_request',
  body: 'bad_request',
};

/** The app-wide schemaErrorFormatter; a route with a body schema gives its own fallback. */
export function schemaErrorFormatter(errors: FastifySchemaValidationError[], part: RequestPart): Error {
  return registryError(errors, part, FALLBACK[part]);
}
