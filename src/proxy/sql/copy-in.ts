// COPY FROM STDIN, as the backend runs it: from its CopyInResponse it reads only CopyData, CopyDone
// and CopyFail, ignores Flush and Sync, and takes any other message as an error it cannot be matched
// with. So while the writer's copy stream is open its copy messages, Flushes and Syncs go straight
// through (never held for an answer that comes only after the copy ends), and anything else ends
// the session. A COPY started by an extended-protocol Execute still needs a Sync after the copy
// (libpq sends one after CopyDone).
//
// Every message sent has exactly the replies expected for it: a Sync one ReadyForQuery, none when
// the backend ignores it in COPY IN. Which Syncs it ignores is known only once the copy ends:
// - The Syncs the writer sent after the COPY's Execute or Query and before its copy end (libpq:
//   Parse/Bind/Execute/Sync, then the data) reach the backend in COPY IN. Those sent before the
//   CopyInResponse came had a reply queued: it is taken out. The first one's (after an Execute)
//   is kept for the Sync after the copy end (`owed`: it then answers that Sync), unless that Sync
//   went already and has its own.
// - A copy that completes (CommandComplete) read all of them in COPY IN: none is answered.
// - A copy the backend ended with an error (the data, a statement trigger, a cancel or timeout,
//   CopyFail) answers those it read after the error, the last ones sent: how many only the backend
//   knows. The relay then sends a Sync and an empty Query of its own and counts the ReadyForQuery
//   messages that come before the empty Query's answer (relay.ts recount). A ReadyForQuery is never
//   taken for the answer to a later message: the relay's picture of the state stays the backend's.
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
  private stream = false;
  /** The reply of an ignored Sync, for the writer's next Sync: the one after the copy end of an Execute's COPY. */
  private owed: Reply | null = null;
  /** The writer's Syncs the backend reached in COPY IN, no reply queued: answered only if it read them after an error. */
  private uncertain = 0;

  constructor(private readonly replies: Replies) {}

  /** The writer's messages go straight through now (its copy stream, or the Sync owed after it). */
  get open(): boolean {
    return this.stream || this.owed !== null;
  }

  /** The copy ends sent so far: a reply's copyEndsAt (see onCopyInResponse). */
  get endsSent(): number {
    return this.ends;
  }

  /**
   * A writer's message while the copy is open (`open`), other than copy data: 'pass' for a Flush,
   * or a Sync in the copy stream (sent as is, no reply expected), the owed reply for the Sync after
   * the copy (sent, that reply expected), 'leave' for a Terminate (the writer quits mid-copy: the
   * session ends, the copy rolls back, nothing to warn about), else why the session ends.
   */
  admit(msg: ClientMessage): 'pass' | 'leave' | Reply | string {
    if (msg.type === 'terminate') return 'leave';
    if (msg.type !== 'sync' && msg.type !== 'flush') return this.stream ? NOT_COPY_DATA : NOT_SYNC_AFTER_COPY;
    if (msg.type === 'flush') return 'pass';
    if (this.stream) {
      this.uncertain++;
      return 'pass';
    }
    const owed = this.owed!;
    this.owed = null;
    owed.copyEndsAt = this.ends;
    return owed;
  }

  /** The writer's CopyDone or CopyFail went to the backend. */
  ended(): void {
    this.ends++;
    this.stream = false;
  }

  /** CopyInResponse to `head`, the writer's Query or Execute: null, or why the session ends. */
  onCopyInResponse(head: Reply | undefined): string | null {
    if (head === undefined) throw new Error('CopyInResponse from the database answers nothing');
    this.active = true;
    const later = this.replies.after(head);
    // What the writer sent after the Execute or Query reached the backend in COPY IN, up to its copy end.
    const during = later.filter((e) => e.copyEndsAt === head.copyEndsAt);
    if (during.some((e) => e.kind !== 'sync')) return NOT_COPY_DATA;
    for (const e of during) this.replies.remove(e);
    this.uncertain = during.length;
    // The Sync after the copy end went already: its own reply is queued.
    const syncAfterEnd = later.some((e) => e.copyEndsAt > head.copyEndsAt && e.kind === 'sync');
    this.owed = head.kind === 'execute' && during.length > 0 && !syncAfterEnd ? during[0]! : null;
    this.stream = this.ends === head.copyEndsAt;
    return null;
  }

  /**
   * A CommandComplete or ErrorResponse (`error`): the copy, if one runs, is over on the backend's
   * side (an error aborts it: the backend drops the rest of the writer's copy data; after an
   * Execute it waits for a Sync). How many of the writer's Syncs it may answer that no reply is
   * queued for: after an error, those it reached in COPY IN (0: the count is known).
   */
  onEnd(error: boolean): number {
    if (!this.active) return 0;
    this.active = false;
    this.stream = false;
    const uncertain = error ? this.uncertain : 0;
    this.uncertain = 0;
    return uncertain;
  }
}
