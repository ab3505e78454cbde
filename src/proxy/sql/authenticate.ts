// Who is logging in to the SQL endpoint. In open mode any user name is accepted (it is the writer
// id). With keys, the user name is the key's name and the password its bearer key, checked with
// SCRAM-SHA-256 (the key's salted SCRAM keys are derived at start-up from its `secret`; a key given
// only as `secretSha256` can log in only over TLS, with a cleartext password). Cleartext passwords
// are asked for only on a TLS session, and only for keys without SCRAM keys. A name that is no key
// goes through the same exchange with made-up keys and a salt stable for the name
// (mockScramSecret), and fails at the proof.
import { timingSafeEqual } from 'node:crypto';
import { BodyReader, type Frame } from './wire/framing.ts';
import {
  authenticationCleartextPassword,
  authenticationSasl,
  authenticationSaslContinue,
  authenticationSaslFinal,
} from './wire/backend.ts';
import { MECHANISM, ScramError, ScramServer, mockScramSecret } from '../access/scram.ts';
import { digestOf, type AccessKey } from '../access/keys.ts';
import { ClientLeft, Refusal, refuse, type StartupChannel } from './startup-channel.ts';
import { SQLSTATE } from '../../fence/index.ts';

/** An authentication message ('p'), or a refusal; Terminate ends the startup quietly. */
function authMessage(f: Frame, expected: string): Frame {
  if (f.type === 'X') throw new ClientLeft('the client terminated during authentication');
  if (f.type !== 'p') throw refuse(SQLSTATE.PROTOCOL_VIOLATION, `expected ${expected}, got message type ${JSON.stringify(f.type)}`);
  return f;
}

/**
 * The key `user` logs in as (null: open mode, no keys), once its password is proven; a refusal
 * otherwise. `mockNonce` keys the made-up salts of names that are no key.
 */
export async function authenticate(
  channel: StartupChannel,
  keys: readonly AccessKey[],
  user: string,
  mockNonce: Buffer,
): Promise<AccessKey | null> {
  if (keys.length === 0) return null;
  const failed = () => refuse(SQLSTATE.INVALID_PASSWORD, `password authentication failed for user ${JSON.stringify(user)}`);
  const key = keys.find((k) => k.name === user) ?? null;
  const socket = channel.socket;
  if (!channel.encrypted && key !== null && key.scram === undefined) {
    // SCRAM needs the secret's salted keys, which a secretSha256 key does not keep: its password
    // can only be sent as is, so only inside TLS. Say so, not "password failed".
    throw refuse(
      SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
      `key ${JSON.stringify(user)} can log in to the SQL endpoint over TLS only: it keeps only secretSha256, which SCRAM cannot use`,
      'Serve TLS (FENCEPOST_TLS_CERT, FENCEPOST_TLS_KEY) and connect with sslmode=require, or give the key a plain `secret` (SCRAM).',
    );
  }
  if (key !== null && key.scram === undefined) {
    // A secretSha256 key has no SCRAM keys: over TLS only, the password itself.
    socket.write(authenticationCleartextPassword());
    const pw = authMessage(await channel.next(), 'a password message');
    let given = '';
    try {
      given = new BodyReader(pw.body).cstring();
    } catch {
      throw refuse(SQLSTATE.PROTOCOL_VIOLATION, 'malformed password message');
    }
    if (!timingSafeEqual(digestOf(given), key.digest)) throw failed();
    return key;
  }
  const server = new ScramServer(key?.scram ?? mockScramSecret(mockNonce, user), key?.scram !== undefined);
  socket.write(authenticationSasl(MECHANISM));
  try {
    const first = authMessage(await channel.next(), 'a SASL response');
    const r = new BodyReader(first.body);
    const mechanism = r.cstring();
    if (mechanism !== MECHANISM)
      throw refuse(SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION, `authentication method ${mechanism} is not supported (use ${MECHANISM})`);
    const len = r.int32();
    const clientFirst = r.bytes(Math.max(0, len)).toString('utf8');
    socket.write(authenticationSaslContinue(server.first(clientFirst)));
    const fin = authMessage(await channel.next(), 'a SASL response');
    const serverFinal = server.final(fin.body.toString('utf8'));
    socket.write(authenticationSaslFinal(serverFinal));
  } catch (err) {
    if (err instanceof Refusal || err instanceof ClientLeft) throw err;
    if (err instanceof ScramError && /channel binding|malformed/.test(err.message))
      throw refuse(SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION, err.message);
    throw failed();
  }
  if (key === null) throw failed();
  return key;
}
