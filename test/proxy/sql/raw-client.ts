// A raw protocol client for the SQL endpoint's tests: it writes exactly the messages it is given,
// in the socket writes it is given, with no driver in between, and reads what comes back up to a
// number of ReadyForQuery messages or until the proxy closes the session.
import { connect as tcp, type Socket } from 'node:net';
import { MessageReader, cstr, int16, int32, message, type Frame } from '../../../src/proxy/sql/wire/framing.ts';
import { commandTag, dataRowTexts, parameterOf, parseErrorFields } from '../../../src/proxy/sql/wire/backend.ts';

export interface Replies {
  frames: Frame[];
  /** SQLSTATE of each ErrorResponse, in order. */
  errors: string[];
  /** Tag of each CommandComplete, in order. */
  tags: string[];
  /** Each DataRow's values as text (NULL as ''). */
  rows: string[][];
  /** Each ParameterStatus as [name, value]. */
  parameters: [string, string][];
  /** Status of the last ReadyForQuery read ('' if none). */
  status: string;
  /** The proxy closed the connection. */
  closed: boolean;
}

export class RawClient {
  private readonly reader = new MessageReader();
  private readonly frames: Frame[] = [];
  private ended = false;
  private wake: (() => void) | null = null;

  private constructor(private readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      this.reader.push(chunk);
      for (let f = this.reader.next(); f !== null; f = this.reader.next()) this.frames.push(f);
      this.wake?.();
    });
    const end = () => {
      this.ended = true;
      this.wake?.();
    };
    socket.on('close', end);
    socket.on('error', end);
  }

  /** Connects to the endpoint on `port` and waits for the first ReadyForQuery. */
  static async connect(port: number, database: string, user: string, options = ''): Promise<RawClient> {
    const socket = tcp({ host: '127.0.0.1', port });
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    const raw = new RawClient(socket);
    const params = ['user', user, 'database', database, ...(options === '' ? [] : ['options', options])];
    socket.write(message('', 196608, ...params, Buffer.from([0])));
    const hello = await raw.read(1);
    if (hello.closed || hello.status !== 'I') throw new Error(`startup failed: ${hello.errors.join(', ')}`);
    return raw;
  }

  /** One socket write of these messages. */
  write(...parts: Buffer[]): void {
    if (!this.socket.destroyed) this.socket.write(Buffer.concat(parts));
  }

  /** Replies up to the n-th ReadyForQuery from now, or up to the connection's end. */
  async read(n: number): Promise<Replies> {
    const out: Frame[] = [];
    let seen = 0;
    while (seen < n) {
      const f = this.frames.shift();
      if (f === undefined) {
        if (this.ended) break;
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`no ReadyForQuery after ${out.map((o) => o.type).join('')}`)), 10_000);
          this.wake = () => {
            clearTimeout(timer);
            this.wake = null;
            resolve();
          };
        });
        continue;
      }
      out.push(f);
      if (f.type === 'Z') seen++;
    }
    const last = out.filter((f) => f.type === 'Z').at(-1);
    return {
      frames: out,
      errors: out.filter((f) => f.type === 'E').map((f) => parseErrorFields(f.body).get('C') ?? '?'),
      tags: out.filter((f) => f.type === 'C').map((f) => commandTag(f.body)),
      rows: out.filter((f) => f.type === 'D').map((f) => dataRowTexts(f.body)),
      parameters: out
        .filter((f) => f.type === 'S')
        .map((f) => {
          const { name, value } = parameterOf(f.body);
          return [name, value] as [string, string];
        }),
      status: last === undefined ? '' : String.fromCharCode(last.body[0]!),
      closed: seen < n,
    };
  }

  /** Writes the messages in one write and reads up to `n` ReadyForQuery messages. */
  async send(parts: Buffer[], n = 1): Promise<Replies> {
    this.write(...parts);
    return await this.read(n);
  }

  /** Messages that arrived and were not read yet (the connection's end not counted). */
  get unread(): number {
    return this.frames.length;
  }

  close(): void {
    if (!this.socket.destroyed) this.socket.end(message('X'));
  }
}

export const Q = (text: string): Buffer => message('Q', text);
export const P = (text: string, name = ''): Buffer => message('P', name, text, int16(0));
export const B = (statement = '', portal = ''): Buffer => message('B', portal, statement, int16(0), int16(0), int16(0));
export const E = (portal = ''): Buffer => message('E', cstr(portal), int32(0));
export const S = (): Buffer => message('S');
/** Describe of a prepared statement. */
export const D = (name = ''): Buffer => message('D', Buffer.from('S', 'latin1'), name);
export const CLOSE = (target: 'S' | 'P', name: string): Buffer => message('C', Buffer.from(target, 'latin1'), name);
/** Parse/Bind/Execute of one statement (unnamed). */
export const pbe = (text: string): Buffer[] => [P(text), B(), E()];
