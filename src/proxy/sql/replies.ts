// The replies a session waits for: one per message sent to the backend, in order, tagged the
// proxy's own (injected: its answers are swallowed) or the writer's (forwarded as they came).
//
// An ErrorResponse outside a simple Query makes the backend skip to the next Sync: the replies up
// to it are dropped (skipToSync), and until the writer's Sync comes (it may come in a later write)
// no reply is expected for what is sent.
import type { Expect, Kind, Planner } from './planner.ts';
import type { Frame } from './wire/framing.ts';

export interface Reply extends Expect {
  /** query (injected): sees its messages. */
  capture?: (f: Frame) => void;
  /** Called at its ReadyForQuery. */
  onReady?: () => void;
  /** query: the fence after a lone BEGIN failed (see undoBeginOnFenceError). */
  fenceFailed?: boolean;
  /** How many CopyDone/CopyFail of the writer's had gone to the backend when this was sent (copy-in.ts). */
  copyEndsAt: number;
}

/**
 * The reply to one message as the queue holds it: the planner's Expect itself, built from EXPECT
 * (planner.ts) with every field of a Reply present, so the relay's reads of it stay monomorphic and
 * nothing is copied. Each Expect is queued once.
 */
export function replyOf(e: Expect & Pick<Reply, 'capture' | 'onReady'>, copyEndsAt: number): Reply {
  const r = e as Reply;
  if (r.at === undefined) r.at = 0;
  r.fenceFailed = false;
  r.copyEndsAt = copyEndsAt;
  return r;
}

/** A reply answered by a ReadyForQuery: a Sync's or a Query's. */
const endsGroup = (e: Reply): boolean => e.kind === 'sync' || e.kind === 'query';

export class Replies {
  private readonly queue: Reply[] = [];
  /** How many replies in the queue a ReadyForQuery answers (endsGroup): asked for every message either side sends. */
  private groupEnds = 0;
  /** An error in an extended group whose Sync is not sent yet: the backend skips what comes until then. */
  skipping = false;

  constructor(private readonly planner: Planner) {}

  /** The reply the backend's next message belongs to. */
  get head(): Reply | undefined {
    return this.queue[0];
  }

  /** Any reply outstanding. */
  get waiting(): boolean {
    return this.queue.length > 0;
  }

  /** A ReadyForQuery outstanding: the group sent last is not answered yet. */
  get awaitingReady(): boolean {
    return this.groupEnds > 0;
  }

  /** A reply the writer waits for (not only the proxy's own). */
  get writerWaits(): boolean {
    return this.queue.some((e) => !e.injected);
  }

  /** A writer's request that may commit (planner.ts mayCommit) is unanswered. */
  get commitInFlight(): boolean {
    return this.queue.some((e) => !e.injected && e.mayCommit === true);
  }

  /** A message went to the backend: its reply, unless the backend skips it. */
  expect(e: Reply): void {
    if (this.skipping) {
      if (e.kind !== 'sync' && e.kind !== 'query') {
        this.skipped(e); // no response comes
        return;
      }
      this.skipping = false;
    }
    this.queue.push(e);
    if (endsGroup(e)) this.groupEnds++;
  }

  /** The head, which `f` answers (a reply of kind `kind` or `orKind`); a message that answers nothing expected breaks the protocol. */
  pop(f: Frame, kind: Kind, orKind: Kind = kind): Reply {
    const e = this.shift();
    if (e === undefined || (e.kind !== kind && e.kind !== orKind))
      throw new Error(`message ${JSON.stringify(f.type)} from the database does not answer ${e?.kind ?? 'anything'}`);
    return e;
  }

  private shift(): Reply | undefined {
    const e = this.queue.shift();
    if (e !== undefined && endsGroup(e)) this.groupEnds--;
    return e;
  }

  /** The replies queued after `e`. */
  after(e: Reply): Reply[] {
    return this.queue.slice(this.queue.indexOf(e) + 1);
  }

  /** How many replies are queued ahead of `e`. */
  before(e: Reply): number {
    return this.queue.indexOf(e);
  }

  /** A reply that will never come (a Sync the backend ignored during COPY). */
  remove(e: Reply): void {
    const i = this.queue.indexOf(e);
    if (i < 0) return;
    this.queue.splice(i, 1);
    if (endsGroup(e)) this.groupEnds--;
  }

  /** An error in an extended group: the backend skips everything up to the next Sync. */
  skipToSync(): void {
    while (this.queue.length > 0 && this.queue[0]!.kind !== 'sync') this.skipped(this.shift()!);
    if (this.queue.length === 0) this.skipping = true;
  }

  /** A message the backend refused or skipped: what it would change, changes nothing; fence statements it would prepare are not. */
  private skipped(e: Reply): void {
    if (e.change !== undefined) this.planner.discard(e.change);
    if (e.injected && e.kind === 'parse') this.planner.statementsDropped();
  }
}
