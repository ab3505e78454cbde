// Certificates for TLS tests: self-signed by openssl into a folder, and replaced in place as a
// deploy tool would (one rename), for the reload-on-SIGHUP tests of both doors.
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface TestCert {
  cert: string;
  key: string;
  pem: Buffer;
  fingerprint: string;
}

/** A self-signed certificate for 127.0.0.1 and localhost, written as <dir>/<name>.cert.pem / .key.pem. */
export function makeCert(dir: string, name: string): TestCert {
  const cert = join(dir, `${name}.cert.pem`);
  const key = join(dir, `${name}.key.pem`);
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      key,
      '-out',
      cert,
      '-days',
      '2',
      '-subj',
      `/CN=${name}`,
      '-addext',
      'subjectAltName=IP:127.0.0.1,DNS:localhost',
    ],
    { stdio: 'ignore' },
  );
  const pem = readFileSync(cert);
  return { cert, key, pem, fingerprint: new X509Certificate(pem).fingerprint256 };
}

/** Replaces `target` with `source`'s content in one rename. */
export function replaceFile(source: string, target: string): void {
  writeFileSync(`${target}.new`, readFileSync(source));
  renameSync(`${target}.new`, target);
}
