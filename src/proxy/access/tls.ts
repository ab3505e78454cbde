// TLS material of the proxy's listeners (FENCEPOST_TLS_CERT / FENCEPOST_TLS_KEY): read and checked
// once at start, replaced on reload (SIGHUP). One instance serves every listener: the HTTP server
// takes `pem()` (and `setSecureContext` after a reload), the SQL endpoint wraps a socket after
// SSLRequest with `current()`. A reload that fails keeps the material in use: a half-written or
// mismatched pair never takes the proxy's TLS down.
import { readFileSync } from 'node:fs';
import { X509Certificate, createPrivateKey, type KeyObject } from 'node:crypto';
import { createSecureContext, type SecureContext } from 'node:tls';
import { ConfigError, type TlsFiles } from '../config.ts';

export type { TlsFiles } from '../config.ts';

export interface TlsPem {
  cert: Buffer;
  key: Buffer;
}

interface Loaded {
  pem: TlsPem;
  context: SecureContext;
  /** SHA-256 fingerprint of the leaf, for logs. */
  fingerprint: string;
}

function read(file: string, variable: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new ConfigError(variable, `cannot read ${file}: ${(err as Error).message}`);
  }
}

/** Reads and checks the pair; throws ConfigError naming the variable whose file is at fault. */
function load(files: TlsFiles): Loaded {
  const cert = read(files.certFile, 'FENCEPOST_TLS_CERT');
  const key = read(files.keyFile, 'FENCEPOST_TLS_KEY');
  let leaf: X509Certificate;
  try {
    leaf = new X509Certificate(cert);
  } catch (err) {
    throw new ConfigError('FENCEPOST_TLS_CERT', `${files.certFile} is not a PEM certificate: ${(err as Error).message}`);
  }
  let privateKey: KeyObject;
  try {
    privateKey = createPrivateKey(key);
  } catch (err) {
    throw new ConfigError('FENCEPOST_TLS_KEY', `${files.keyFile} is not a PEM private key: ${(err as Error).message}`);
  }
  if (!leaf.checkPrivateKey(privateKey)) {
    throw new ConfigError(
      'FENCEPOST_TLS_KEY',
      `${files.keyFile} is not the key of the certificate in ${files.certFile} (FENCEPOST_TLS_CERT)`,
    );
  }
  let context: SecureContext;
  try {
    context = createSecureContext({ cert, key });
  } catch (err) {
    throw new ConfigError('FENCEPOST_TLS_CERT', `${files.certFile} with ${files.keyFile}: ${(err as Error).message}`);
  }
  return { pem: { cert, key }, context, fingerprint: leaf.fingerprint256 };
}

export class TlsMaterial {
  private loaded: Loaded;

  private constructor(
    readonly files: Readonly<TlsFiles>,
    loaded: Loaded,
  ) {
    this.loaded = loaded;
  }

  /** Reads the files now; throws ConfigError (naming FENCEPOST_TLS_CERT or FENCEPOST_TLS_KEY) if they are unusable. */
  static load(files: TlsFiles): TlsMaterial {
    return new TlsMaterial(Object.freeze({ ...files }), load(files));
  }

  /** The context to hand new connections (e.g. `new TLSSocket(socket, { isServer: true, secureContext })`). */
  current(): SecureContext {
    return this.loaded.context;
  }

  /** The PEMs in use, as `https.createServer` / `server.setSecureContext` take them. */
  pem(): TlsPem {
    return this.loaded.pem;
  }

  /** SHA-256 fingerprint of the certificate in use (colon-separated hex). */
  fingerprint(): string {
    return this.loaded.fingerprint;
  }

  /**
   * Reads the files again. On success later connections get the new pair (connections already up
   * keep theirs); on failure the old pair stays in use and the ConfigError is thrown for the log.
   */
  reload(): void {
    this.loaded = load(this.files);
  }
}
