// Candidate znode names and their sequence numbers.
//
// A candidate node is named `c_<uuid>_<join>-<sequence>`: <uuid> is fixed per Election object
// (protected mode: a create whose reply was lost is found again by it), <join> counts the
// candidate's attempts to join, and ZooKeeper appends <sequence>, the parent's child version
// formatted as "%010d". The counter is a signed int32: after 2^31 child creates/deletes under one
// parent it wraps and prints a minus sign, so a wrapped number is refused, never compared.
import { hostname } from 'node:os';
import { SequenceOverflowError } from './errors.ts';

export const NODE_PREFIX = 'c_';
const NAME = /^c_([0-9a-f-]{36})_(\d+)-(-?\d{9,10})$/;
export const INT32_MAX = 2 ** 31 - 1;
/** Warn when the parent's child version gets this close to wrapping. */
export const SEQUENCE_WARN_REMAINING = 2 ** 24;

export interface CandidateNode {
  name: string;
  uuid: string;
  join: number;
  /** The sequence number ZooKeeper appended; the fencing token when this node leads. */
  seq: number;
}

/** The name passed to create() (ZooKeeper appends the sequence). */
export function candidatePrefix(uuid: string, join: number): string {
  return `${NODE_PREFIX}${uuid}_${join}-`;
}

/** Parses a candidate name; null for names that are not candidates. Throws if the sequence wrapped. */
export function parseCandidate(name: string): CandidateNode | null {
  const m = NAME.exec(name);
  if (!m) return null;
  const [, uuid, join, digits] = m as unknown as [string, string, string, string];
  const seq = Number(digits);
  if (digits.startsWith('-') || !Number.isSafeInteger(seq) || seq > INT32_MAX) {
    throw new SequenceOverflowError(
      `election node ${name} carries a wrapped sequence number (${digits}): the int32 counter of its parent overflowed; ` +
        'use a new election path (tokens there must start above the highest token ever issued here)',
    );
  }
  return { name, uuid, join: Number(join), seq };
}

/** Candidates among `children`, lowest sequence first (compared as numbers, not strings). */
export function sortCandidates(children: readonly string[]): CandidateNode[] {
  const out: CandidateNode[] = [];
  for (const name of children) {
    const c = parseCandidate(name);
    if (c) out.push(c);
  }
  return out.sort((a, b) => a.seq - b.seq || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** Checks the parent's child version (the next sequence number). Throws once wrapped. */
export function checkParentCversion(cversion: number): { remaining: number } {
  if (cversion < 0) {
    throw new SequenceOverflowError(
      `the election parent's child version is ${cversion}: its sequence counter wrapped; refusing to elect, as tokens must never go backwards`,
    );
  }
  return { remaining: INT32_MAX - cversion };
}

/** Why `path` cannot be an election path (absolute, no trailing or double slash), or null. */
export function electionPathProblem(path: string): string | null {
  if (!path.startsWith('/') || path.endsWith('/') || path.includes('//'))
    return 'must be an absolute ZooKeeper path without a trailing slash';
  return null;
}

/** The candidate id when none is given: `<hostname>-<pid>`. */
export function defaultCandidateId(): string {
  return `${hostname()}-${process.pid}`;
}
