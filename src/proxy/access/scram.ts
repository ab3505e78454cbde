// SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres speaks it, both sides: the proxy is the server
// for writers (the password is the bearer key; only its salted keys are kept) and the client of
// the backend (the client login's password). No channel binding (-PLUS is not offered, even over
// TLS), so a client that insists on channel binding is refused.
import { createHash, createHmac, pbkdf2Sync, randomBytes, timingSafeEqual } from 'node:crypto';

export const MECHANISM = 'SCRAM-SHA-256';
const ITERATIONS = 4096;

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

/** The SCRAM secret of `password` (SASLprep is skipped: keys are ASCII without spaces). */
export function scramSecret(password: string, iterations = ITERATIONS, salt: Buffer = randomBytes(16)): ScramSecret {
  const salted = pbkdf2Sync(password, salt, iterations, 32, 'sha256');
  return { iterations, salt, storedKey: sha256(hmac(salted, 'Client Key')), serverKey: hmac(salted, 'Server Key') };
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
 * The server side of one exchange. `secret` null: an unknown user, answered with made-up
 * parameters so the exchange looks the same, and failed at the proof.
 */
export class ScramServer {
  private readonly secret: ScramSecret;
  private readonly known: boolean;
  private clientFirstBare = '';
  private serverFirst = '';
  private nonce = '';
  private gs2 = '';

  constructor(secret: ScramSecret | null) {
    this.known = secret !== null;
    this.secret = secret ?? { iterations: ITERATIONS, salt: randomBytes(16), storedKey: randomBytes(32), serverKey: randomBytes(32) };
  }

  /** client-first-message → server-first-message. */
  first(clientFirst: string): string {
    // gs2-header: "n,," (no channel binding) or "y,," (client could but thinks we cannot).
    const m = /^([ny]),(?:a=[^,]*)?,(.*)$/.exec(clientFirst);
    if (!m) throw new ScramError(clientFirst.startsWith('p=') ? 'channel binding is not supported (no TLS)' : 'malformed SCRAM client-first message');
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

  final(serverFirst: string): string {
    const a = attributes(serverFirst);
    const nonce = a.get('r');
    const salt = a.get('s');
    const iterations = Number(a.get('i'));
    if (!nonce?.startsWith(this.clientNonce) || salt === undefined || !Number.isInteger(iterations) || iterations < 1) {
      throw new ScramError('malformed SCRAM server-first message');
    }
    const salted = pbkdf2Sync(this.password, Buffer.from(salt, 'base64'), iterations, 32, 'sha256');
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
      throw new ScramError('the server\'s SCRAM signature does not match');
    }
  }
}
