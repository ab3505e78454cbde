// Candidate names and sequence numbers (pure functions).
import { expect, test } from 'vitest';
import { SequenceOverflowError } from '../../src/election/errors.ts';
import { candidatePrefix, checkParentCversion, parseCandidate, sortCandidates } from '../../src/election/sequence.ts';

const U1 = 'aaaaaaaa-0000-4000-8000-000000000000';
const U2 = 'bbbbbbbb-0000-4000-8000-000000000000';

test('orders candidates by sequence number, not by name', () => {
  // Invariant: the leader is the lowest sequence whatever the uuid in the name.
  const names = [`${candidatePrefix(U1, 1)}0000000009`, `${candidatePrefix(U2, 1)}0000000002`, 'not-a-candidate'];
  expect(sortCandidates(names).map((c) => c.seq)).toEqual([2, 9]);
});

test('parses uuid, join number and sequence from a candidate name', () => {
  expect(parseCandidate(`${candidatePrefix(U1, 7)}2147483647`)).toEqual({
    name: `${candidatePrefix(U1, 7)}2147483647`,
    uuid: U1,
    join: 7,
    seq: 2147483647,
  });
  expect(parseCandidate('lock-0000000001')).toBeNull();
});

test('refuses wrapped sequence numbers instead of comparing them', () => {
  // Invariant: after the int32 counter wraps, no number from it is ever used as a token.
  expect(() => parseCandidate(`${candidatePrefix(U1, 1)}-000000001`)).toThrow(SequenceOverflowError);
  expect(() => parseCandidate(`${candidatePrefix(U1, 1)}-2147483648`)).toThrow(SequenceOverflowError);
  expect(() => checkParentCversion(-2147483648)).toThrow(SequenceOverflowError);
  expect(checkParentCversion(2147483600).remaining).toBe(47);
});
