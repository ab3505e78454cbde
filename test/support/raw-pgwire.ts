// A raw protocol client for the SQL endpoint: pipelines exactly as written, no driver in between.
import { connect as tcp, type Socket } from 'node:net';
import { MessageReader, cstr, int16, int32, message, parseErrorFields, type Frame } from '../../src/proxy/sql/framing.ts';

export interface RawAnswer {
  /** SQLSTATEs of the ErrorResponses. */
  errors: string[];
  /** The last ReadyForQuery's status. */
  status: string;
  /** Every message's type, in order. */
  types: string;
  /** Each DataRow's columns as text (null for NULL). */
  rows: (string | null)[][];
  /** Each ParameterStatus as [name, value]. */
  parameters: [string, string][];
}

export class RawClient {
  private readonly reader = new MessageReader();
  private frames: Frame[] = [];
  private wake: (() => void) | null = null;
  private constructor(private readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      this.reader.push(chunk);
      for (let f = this.reader.next(); f !== null; f = this.reader.next()) this.frames.push(f);
      this.wake?.();
    });
  }

  static async connect(port: number, database: string, user: string, options?: string): Promise<RawClient> {
    const socket = tcp({ host: '127.0.0.1', port });
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    const raw = new RawClient(socket);
    const params = ['user', user, 'database', database, ...(options === undefined ? [] : ['options', options])];
    socket.write(message('', 196608, ...params, Buffer.from([0])));
    await raw.untilReady(1);
    return raw;
  }

  /** Messages until the n-th ReadyForQuery (the ReadyForQuerys included). */
  async untilReady(n: number): Promise<Frame[]> {
    const out: Frame[] = [];
    let seen = 0;
    while (seen < n) {
      const f = this.frames.shift();
      if (f === undefined) {
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
    return out;
  }

  /** Sends the messages, waits for `syncs` ReadyForQuerys. */
  async send(parts: Buffer[], syncs = 1): Promise<RawAnswer> {
    this.socket.write(Buffer.concat(parts));
    const got = await this.untilReady(syncs);
    const last = got[got.length - 1]!;
    return {
      errors: got.filter((f) => f.type === 'E').map((f) => parseErrorFields(f.body).get('C') ?? '?'),
      status: String.fromCharCode(last.body[0]!),
      types: got.map((f) => f.type).join(''),
      rows: got.filter((f) => f.type === 'D').map(dataRow),
      parameters: got.filter((f) => f.type === 'S').map((f) => f.body.toString('utf8').split('\0').slice(0, 2) as [string, string]),
    };
  }

  close(): void {
    this.socket.end(message('X'));
  }
}

function dataRow(f: Frame): (string | null)[] {
  const cols: (string | null)[] = [];
  let at = 2;
  for (let i = 0; i < f.body.readInt16BE(0); i++) {
    const len = f.body.readInt32BE(at);
    at += 4;
    cols.push(len < 0 ? null : f.body.toString('utf8', at, at + len));
    if (len > 0) at += len;
  }
  return cols;
}

export const Q = (text: string) => message('Q', text);
export const P = (text: string, name = '') => message('P', name, text, int16(0));
export const B = (name = '') => message('B', cstr(''), name, int16(0), int16(0), int16(0));
export const D = (name = '') => message('D', Buffer.from('S'), name);
export const E = () => message('E', cstr(''), int32(0));
export const S = () => message('S');
/** Parse/Bind/Execute of one statement (unnamed). */
export const pbe = (text: string) => [P(text), B(), E()];
