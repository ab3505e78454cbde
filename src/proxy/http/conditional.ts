// Conditional requests on objects (RFC 9110 §13): ETags, If-Match and If-None-Match.
//
// An object's ETag is `"<incarnation>.<version>"` (src/fence/sql/objects.ts ETAG_SQL): it changes with
// every write and never comes back for the same key, not even after a delete. Writes send their
// preconditions into the fenced write statement, which checks them on the object it locks
// (src/fence/sql/objects.ts fencedWrite); reads compare here.
import type { FastifyRequest } from 'fastify';
import type { Precondition } from '../../fence/index.ts';

/** One entity tag, strong or weak (`W/"…"`), as RFC 9110 spells it. */
const ENTITY_TAG = String.raw`(?:W/)?"[\x21\x23-\x7e\x80-\xff]*"`;

/** `If-Match` of a write: `*`, or entity tags (a comma-separated list). */
export const IF_MATCH = {
  type: 'string',
  pattern: String.raw`^(?:\*|${ENTITY_TAG}(?:[ \t]*,[ \t]*${ENTITY_TAG})*)$`,
  description:
    '* (the object exists) or a list of entity tags, one of which the object has (strong comparison); else 412 precondition_failed',
} as const;

/** `If-None-Match` of a write: only `*`. */
export const IF_NONE_MATCH_WRITE = {
  type: 'string',
  pattern: String.raw`^\*$`,
  description: '* (the object does not exist, so the write creates it); else 412 precondition_failed. Entity tags are not taken on writes',
} as const;

/** `If-None-Match` of a read: `*` or entity tags; anything else is ignored. */
export const IF_NONE_MATCH_READ = {
  type: 'string',
  description: '* or a list of entity tags: 304 Not Modified when the object has one of them (weak comparison)',
} as const;

/** The ETag header value of an object whose tag (from the database) is `tag`. */
export function etagHeader(tag: string): string {
  return `"${tag}"`;
}

/** The entity tags of a header value, as `{ weak, tag }` (tag without quotes). */
function entityTags(header: string): { weak: boolean; tag: string }[] {
  return [...header.matchAll(/(W\/)?"([^"]*)"/g)].map((m) => ({ weak: m[1] !== undefined, tag: m[2]! }));
}

function headerOf(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name];
  return typeof v === 'string' ? v : undefined;
}

/**
 * The precondition of a PUT or DELETE, from headers the route schema has validated (IF_MATCH,
 * IF_NONE_MATCH_WRITE). If-Match compares strongly: weak tags can never match, so they are left out.
 */
export function writePrecondition(req: FastifyRequest): Precondition {
  const ifMatch = headerOf(req, 'if-match');
  return {
    ifMatch:
      ifMatch === undefined
        ? null
        : ifMatch === '*'
          ? '*'
          : entityTags(ifMatch)
              .filter((t) => !t.weak)
              .map((t) => t.tag),
    ifNoneMatch: headerOf(req, 'if-none-match') === '*',
  };
}

/** A GET's If-None-Match holds against the object's tag: answer 304 (weak comparison). */
export function notModified(req: FastifyRequest, tag: string): boolean {
  const header = headerOf(req, 'if-none-match');
  if (header === undefined) return false;
  if (header.trim() === '*') return true;
  return entityTags(header).some((t) => t.tag === tag);
}
