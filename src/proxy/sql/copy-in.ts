// COPY FROM STDIN, as the backend runs it: from its CopyInResponse it reads only CopyData, CopyDone
// and CopyFail, ignores Flush and Sync, and takes any other message as an error it cannot be matched
// with. So while the writer's copy stream is open its copy messages, Flushes and Syncs go straight
// through (never held for an answer that comes only after the copy ends), and anything else ends
// the session. A COPY started by an extended-protocol Execute still needs a Sync after the copy
// (libpq sends one after CopyDone): that Sync answers the group's first one, which the backend
// ignored.
import type { ClientMessage } from './wire/frontend.ts';
import type { Replies, Reply } from './replies.ts';

export const NOT_COPY_DATA = 'a message other than CopyData, CopyDone, CopyFail, Flush or Sync during COPY FROM STDIN';
const NOT_SYNC_AFTER_COPY = 'a message other than Sync after the copy data of a COPY FROM STDIN started by Execute';

export class CopyIn {
  /** CopyDone and CopyFail messages of the writer's sent to the backend so far. */
  private ends = 0;
  /** The backend is in COPY IN (CopyInResponse, no CommandComplete or error since). */
  private active = false;
  /** The writer's copy stream is open: the backend is in COPY IN and the writer has not ended it. */
  private stream: { extended: boolean } | null = null;
  /** The backend needs one more Sync for a COPY started by an Execute. */
  private owedSync = false;

  constructor(private readonly replies: Replies) {}

  /** The writer's messages go straight through now (its copy stream, or the Sync owed after it). */
  get open(): boolean {
    return this.stream !== null || this.owedSync;
  }

  /** The copy ends sent so far: a reply's copyEndsAt (see onCopyInResponse). */
  get endsSent(): number {
    return this.ends;
  }

  /**
   * A writer's message while the copy is open (`open`), other than copy data: 'pass' for a Flush
   * or Sync (sent as is), 'leave' for a Terminate (the writer quits mid-copy: the session ends, the
   * copy rolls back, nothing to warn about), else why the session ends.
   */
  admit(msg: ClientMessage): 'pass' | 'leave' | string {
    if (msg.type === 'terminate') return 'leave';
    if (msg.type !== 'sync' && msg.type !== 'flush') return this.stream !== null ? NOT_COPY_DATA : NOT_SYNC_AFTER_COPY;
    if (msg.type === 'sync' && this.stream === null) this.owedSync = false;
    return 'pass';
  }

  /** The writer's CopyDone or CopyFail went to the backend. */
  ended(): void {
    this.ends++;
    if (this.stream === null) return;
    if (this.stream.extended) this.owedSync = true;
    this.stream = null;
  }

  /** CopyInResponse to `head`, the writer's Query or Execute: null, or why the session ends. */
  onCopyInResponse(head: Reply | undefined): string | null {
    if (head === undefined) throw new Error('CopyInResponse from the database answers nothing');
    this.active = true;
    const extended = head.kind === 'execute';
    if (extended) {
      // What the writer sent after the Execute reached the backend in COPY IN, up to its copy end.
      const during = this.replies.after(head).filter((e) => e.copyEndsAt === head.copyEndsAt);
      if (during.some((e) => e.kind !== 'sync')) return NOT_COPY_DATA;
      // Ignored Syncs: the first one's ReadyForQuery comes after the copy (owedSync); no other one's does.
      for (const e of during.slice(1)) this.replies.remove(e);
    }
    if (this.ends === head.copyEndsAt) this.stream = { extended };
    else if (extended) this.owedSync = true; // the writer's copy end went with its pipeline
    return null;
  }

  /**
   * A CommandComplete or ErrorResponse: the copy, if one runs, is over on the backend's side (an
   * error aborts it: the backend drops the rest of the writer's copy data; after an Execute it
   * waits for a Sync).
   */
  onEnd(): void {
    if (!this.active) return;
    this.active = false;
    if (this.stream?.extended) this.owedSync = true;
    this.stream = null;
  }
}
