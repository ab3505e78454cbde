// Public API of the election library.
export { Election, candidateId, readLeader } from './election.ts';
export type {
  ConnectionState,
  ElectionEvents,
  ElectionOptions,
  ElectionPolicy,
  ElectionStats,
  LeaderInfo,
  RevokeReason,
} from './election.ts';
export { ZkSession, ZK_CONNECT_WAIT_MS } from './zk-session.ts';
export type { SessionLostReason, SessionState, ZkSessionOptions } from './zk-session.ts';
export {
  ElectionAbortedError,
  ElectionAccessError,
  LeadershipRevokedError,
  SequenceOverflowError,
  SessionLostError,
  ZK_CODES,
  ZkError,
  ZkTimeoutError,
} from './errors.ts';
export { digestId, electionAcl, formatAcl, isElectionAcl, parseDigestAuth, PERMS } from './acl.ts';
export { defaultCandidateId, electionPathProblem, parseCandidate } from './sequence.ts';
export type { AclEntry, DigestAuth } from './acl.ts';
export { formatAdvice, measureSessionTimeoutAdvice, recommendSessionTimeout } from './advice.ts';
export type { Distribution, MeasureOptions, SessionTimeoutAdvice } from './advice.ts';
