// SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres speaks it, both sides: the proxy is the server
// for writers (the password is the bearer key; only its salted keys are kept) and the client of
// the backend (the client login's password). No channel binding (-PLUS is not offered, even over
// TLS), so a client that insists on channel binding is refused.
//
// Passwords are SASLprepped (saslprep.ts; the raw password where SASLprep refuses it), as Postgres
// and libpq do, so a key's secret and what a client sends match when they are equivalent text.
// Salted passwords are derived with the asynchronous pbkdf2 (the thread pool, not the event loop)
// and kept per (password, salt, iterations): a login's backend salt stays the same until its
// password changes. Iteration counts above MAX_ITERATIONS are neither used nor accepted.
import { createHash, createHmac, pbkdf2, pbkdf2Sync, randomBytes, timingSafeEqual } from 'node:crypto';
import { promisify } from 'node:util';
import { saslprepOrRaw } from './saslprep.ts';

export const MECHANISM = 'SCRAM-SHA-256';
/** Postgres's default (scram_iterations). */
const ITERATIONS = 4096;
/** The most iterations the proxy derives a key with: a server asking more is refused (work per login is bounded). */
export const MAX_ITERATIONS = 100_000;

/** What the server keeps of a password (the password itself is gone). */
export interface ScramSecret {
  iterations: number;
  salt: Buffer;
  storedKey: Buffer;
  serverKey: Buffer;
}

const hmac = (key: Buffer, data: string | Buffer) => createHmac('sha256', key).update(data).digest();
const sha256 = (data: Buffer) => createHash('sha256').update(data).digest();

function xor(a: Buffer, b: Buffer): Buffer {
  const out = Buffer.alloc(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! ^ b[i]!;
  return out;
}

function checkIterations(iterations: number): void {
  if (!Number.isInteger(iterations) || iterations < 1 || iterations > MAX_ITERATIONS)
    throw new ScramError(`SCRAM iteration count ${iterations} is not within 1–${MAX_ITERATIONS}`);
}

/**
 * The SCRAM secret of `password`, derived at once (start-up: parsing the configured keys; not
 * while serving).
 */
export function scramSecret(password: string, iterations = ITERATIONS, salt: Buffer = randomBytes(16)): ScramSecret {
  checkIterations(iterations);
  const salted = pbkdf2Sync(saslprepOrRaw(password), salt, iterations, 32, 'sha256');
  return { iterations, salt, storedKey: sha256(hmac(salted, 'Client Key')), serverKey: hmac(salted, 'Server Key') };
}

/**
 * What an unknown user is answered with: a salt and iteration count like a key's, the salt an
 * HMAC of the user name under `serverNonce` (a secret of the process), so it is the same at every
 * attempt, as a key's is, and comparing salts does not tell which names are keys (Postgres's
 * scram_mock_salt). The keys are made up too: no proof matches them, and the server does the same
 * work for the exchange as for a key.
 */
export function mockScramSecret(serverNonce: Buffer, user: string): ScramSecret {
  const derive = (what: string) => createHmac('sha256', serverNonce).update(`${what}\u0000${user}`).digest();
  return { iterations: ITERATIONS, salt: derive('salt').subarray(0, 16), storedKey: derive('stored key'), serverKey: derive('server key') };
}

const pbkdf2Async = promisify(pbkdf2);
/** Salted passwords by password, salt and iterations; few entries (one per client login), dropped oldest first. */
const salted = new Map<string, Promise<Buffer>>();
const MAX_SALTED = 256;

/** PBKDF2-HMAC-SHA-256 of the SASLprepped password, off the event loop; the same inputs again: from memory. */
export function saltedPassword(password: string, salt: Buffer, iterations: number): Promise<Buffer> {
  checkIterations(iterations);
  const key = createHash('sha256').update(password).update('\u0000').update(salt).update(`\u0000${iterations}`).digest('base64');
  let derived = salted.get(key);
  if (derived === undefined) {
    derived = pbkdf2Async(saslprepOrRaw(password), salt, iterations, 32, 'sha256');
    derived.catch(() => salted.delete(key));
    if (salted.size >= MAX_SALTED) salted.delete(salted.keys().next().value!);
    salted.set(key, derived);
  }
  return derived;
}

function attributes(msg: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const part of msg.split(',')) {
    const eq = part.indexOf('=');
    if (eq === 1) m.set(part[0]!, part.slice(2));
  }
  return m;
}

export class ScramError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ScramError';
  }
}

/**
 * The server side of one exchange. `known` false: an unknown user, answered with `secret` from
 * mockScramSecret so the exchange looks the same, and failed at the proof.
 */
export class ScramServer {
  private clientFirstBare = '';
  private serverFirst = '';
  private nonce = '';
  private gs2 = '';

  constructor(
    private readonly secret: ScramSecret,
    private readonly known: boolean,
  ) {}

  /** client-first-message → server-first-message. */
  first(clientFirst: string): string {
    // gs2-header: "n,," (no channel binding) or "y,," (client could but thinks we cannot).
    const m = /^([ny]),(?:a=[^,]*)?,(.*)$/.exec(clientFirst);
    if (!m)
      throw new ScramError(
        clientFirst.startsWith('p=') ? 'channel binding is not supported (no TLS)' : 'malformed SCRAM client-first message',
      );
    this.gs2 = clientFirst.slice(0, clientFirst.length - m[2]!.length);
    this.clientFirstBare = m[2]!;
    const clientNonce = attributes(this.clientFirstBare).get('r');
    if (!clientNonce || !/^[\x21-\x2b\x2d-\x7e]+$/.test(clientNonce)) throw new ScramError('malformed SCRAM client nonce');
    this.nonce = clientNonce + randomBytes(18).toString('base64');
    this.serverFirst = `r=${this.nonce},s=${this.secret.salt.toString('base64')},i=${this.secret.iterations}`;
    return this.serverFirst;
  }

  /** client-final-message → server-final-message; throws ScramError when the proof is wrong. */
  final(clientFinal: string): string {
    const proofAt = clientFinal.lastIndexOf(',p=');
    if (proofAt < 0) throw new ScramError('malformed SCRAM client-final message');
    const withoutProof = clientFinal.slice(0, proofAt);
    const attrs = attributes(withoutProof);
    if (attrs.get('c') !== Buffer.from(this.gs2).toString('base64')) throw new ScramError('SCRAM channel binding does not match');
    if (attrs.get('r') !== this.nonce) throw new ScramError('SCRAM nonce does not match');
    const proof = Buffer.from(clientFinal.slice(proofAt + 3), 'base64');
    const authMessage = `${this.clientFirstBare},${this.serverFirst},${withoutProof}`;
    const signature = hmac(this.secret.storedKey, authMessage);
    if (proof.length !== signature.length) throw new ScramError('password authentication failed');
    const ok = timingSafeEqual(sha256(xor(proof, signature)), this.secret.storedKey);
    if (!ok || !this.known) throw new ScramError('password authentication failed');
    return `v=${hmac(this.secret.serverKey, authMessage).toString('base64')}`;
  }
}

/** The client side of one exchange (the proxy logging in to the backend). */
export class ScramClient {
  private readonly clientNonce = randomBytes(18).toString('base64');
  private clientFirstBare = '';
  private serverSignature: Buffer | null = null;

  constructor(private readonly password: string) {}

  first(): string {
    this.clientFirstBare = `n=*,r=${this.clientNonce}`;
    return `n,,${this.clientFirstBare}`;
  }

  /** server-first-message → client-final-message; the key is derived off the event loop. */
  async final(serverFirst: string): Promise<string> {
    const a = attributes(serverFirst);
    const nonce = a.get('r');
    const salt = a.get('s');
    const iterations = Number(a.get('i'));
    if (!nonce?.startsWith(this.clientNonce) || salt === undefined || !Number.isInteger(iterations) || iterations < 1) {
      throw new ScramError('malformed SCRAM server-first message');
    }
    if (iterations > MAX_ITERATIONS)
      throw new ScramError(`the server asks for ${iterations} SCRAM iterations; the proxy derives at most ${MAX_ITERATIONS}`);
    const salted = await saltedPassword(this.password, Buffer.from(salt, 'base64'), iterations);
    const clientKey = hmac(salted, 'Client Key');
    const withoutProof = `c=biws,r=${nonce}`;
    const authMessage = `${this.clientFirstBare},${serverFirst},${withoutProof}`;
    const proof = xor(clientKey, hmac(sha256(clientKey), authMessage));
    this.serverSignature = hmac(hmac(salted, 'Server Key'), authMessage);
    return `${withoutProof},p=${proof.toString('base64')}`;
  }

  /** Checks the server's signature: the server knew the password too. */
  verify(serverFinal: string): void {
    const v = attributes(serverFinal).get('v');
    const got = Buffer.from(v ?? '', 'base64');
    if (this.serverSignature === null || got.length !== this.serverSignature.length || !timingSafeEqual(got, this.serverSignature)) {
      throw new ScramError("the server's SCRAM signature does not match");
    }
  }
}
