// Who may create and delete election znodes. Without credentials every node fencepost creates is
// `world:anyone` with all permissions: anyone who reaches ZooKeeper can plant a candidate (a node
// named like one, with a low sequence, is taken for the leader) or delete the leader's node. With
// digest credentials (`user:password`, from `--zk-auth` / `ZK_AUTH`) the election path, the parents
// fencepost creates and every candidate get the ELECTION ACL: all permissions for that digest
// identity, read for everyone. Creating or deleting a child needs CREATE or DELETE on its parent,
// so only a session authenticated as the identity can add or remove candidates.
//
// What a reader can verify (the forgery guard, src/proxy/forgery-guard.ts): the parent's ACL (anyone
// may read it), and its ACL version `aversion`. A path created with the election ACL and never
// changed since (aversion 0) has only ever had children created by the identity (or a ZooKeeper
// superuser). A path whose ACL was tightened later may still hold nodes planted before the change,
// so it is not trusted.
import { createHash } from 'node:crypto';

/** ZooKeeper permission bits. */
export const PERMS = Object.freeze({ READ: 1, WRITE: 2, CREATE: 4, DELETE: 8, ADMIN: 16, ALL: 31 });

export interface AclEntry {
  perms: number;
  scheme: string;
  id: string;
}

/** `user:password` credentials for ZooKeeper's digest scheme. */
export interface DigestAuth {
  user: string;
  password: string;
}

/** Parses `user:password` (the password may contain `:`); throws with a message on a bad value. */
export function parseDigestAuth(raw: string): DigestAuth {
  const i = raw.indexOf(':');
  if (i <= 0 || i === raw.length - 1) throw new Error('must be <user>:<password>, both non-empty');
  const user = raw.slice(0, i);
  if (/[\s,]/.test(user)) throw new Error('the user must not contain spaces or commas');
  return { user, password: raw.slice(i + 1) };
}

/** The digest ACL id ZooKeeper derives from the credentials: `user:base64(sha1("user:password"))`. */
export function digestId(auth: DigestAuth): string {
  return `${auth.user}:${createHash('sha1').update(`${auth.user}:${auth.password}`).digest('base64')}`;
}

/** The ACL of every election node: all permissions for the identity, read for everyone. */
export function electionAcl(identity: string): AclEntry[] {
  return [
    { perms: PERMS.ALL, scheme: 'digest', id: identity },
    { perms: PERMS.READ, scheme: 'world', id: 'anyone' },
  ];
}

/**
 * True if only `identity` may change the node's children, data or ACL: every entry that grants
 * more than READ is `digest:<identity>`, and that identity may create children.
 */
export function isElectionAcl(acl: readonly AclEntry[], identity: string): boolean {
  const own = (e: AclEntry): boolean => e.scheme === 'digest' && e.id === identity;
  return acl.every((e) => own(e) || (e.perms & ~PERMS.READ) === 0) && acl.some((e) => own(e) && (e.perms & PERMS.CREATE) !== 0);
}

/** `scheme:id:perms` as zkCli prints it (`cdrwa` letters), for messages. */
export function formatAcl(acl: readonly AclEntry[]): string {
  const letters = (p: number): string =>
    [
      [PERMS.CREATE, 'c'],
      [PERMS.DELETE, 'd'],
      [PERMS.READ, 'r'],
      [PERMS.WRITE, 'w'],
      [PERMS.ADMIN, 'a'],
    ]
      .map(([bit, l]) => ((p & (bit as number)) !== 0 ? l : ''))
      .join('');
  return acl.map((e) => `${e.scheme}:${e.id}:${letters(e.perms)}`).join(',');
}
