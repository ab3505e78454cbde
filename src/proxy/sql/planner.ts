// What the session sends for each of the writer's messages: the fence in front of every transaction
// the writer starts, and refusals. It decides from its own state, the message and what the relay
// reports (the last ReadyForQuery, responses still owed); it opens no socket and sets no timer, so
// it runs without a database (test/proxy/sql/planner.test.ts).
//
// Whenever the last ReadyForQuery said idle ('I') and the writer starts something (a Query, or the
// first message of an extended-protocol group up to Sync), the proxy sends the fence first
// (proof.ts: Parse/Bind/Execute on the unnamed statement, no Sync), so the fence and the writer's
// statements are one backend transaction. A lone `BEGIN …` goes first and the fence right after it
// (in the same round trip), so an isolation level still applies. A lone plain `BEGIN` Query at
// idle (proof.ts deferrableBegin) is answered by the proxy itself and sent, with the fence, in
// front of the writer's next message: one round trip to the database fewer per transaction, and a
// writer paused after its BEGIN holds nothing. Only a text the server's grammar reads as a lone
// BEGIN is held (the writer was told it succeeded). A prepared one (Bind/Execute/Sync of a
// statement whose Parse text was such a BEGIN) is held too when it has transaction modes or is the
// unnamed statement, and sent as that text, never as the writer's Bind of the name
// (holdExtendedBegin); a plain named one goes as sent, the fence in front. If it fails all the same (a cancel), a Query
// behind it still runs with the fence in front of its text, and an extended group is skipped up
// to its Sync. (The transaction's start, now(), is then its first statement's.) Inside a
// transaction ('T')
// nothing is injected: it was fenced when it began. In a failed one ('E') neither: the writer's
// ROLLBACK must go through. A FunctionCall is refused: it runs a function outside any statement.
//
// Transactions that start in the middle of what the writer sent (libpg-query classifies the
// statements, see statements.ts; the read-only session default stays as a backstop):
// - Simple protocol: a Query with a `;` before its end and a transaction word in it is split by
//   the parser; the fence goes in front of the first statement of every transaction in it (after
//   each COMMIT / END / ROLLBACK / ABORT / PREPARE TRANSACTION, with or without AND CHAIN, that
//   is not the last statement; after a BEGIN that opens one), in the same Query string, so each
//   implicit transaction is fenced inside itself. The fence's own responses are swallowed by
//   position (one CommandComplete per statement). Text the parser refuses, or text the server
//   could lex otherwise than the parser (a backslash with standard_conforming_strings off, a
//   character past ASCII in an SJIS-like client encoding: statements.ts lexesAlike) gets its
//   multi-statement Query refused (42601 / 0A000), nothing run. A CALL or DO
//   in a Query always runs in a transaction block (the fence makes even a lone one a
//   multi-statement Query, an implicit block): Postgres itself refuses their COMMIT there.
// - COMMIT / ROLLBACK AND CHAIN open the next transaction themselves: the fence goes right after
//   them, in either protocol, even as the last statement.
// - Extended protocol: each Parse's statement kind is kept (per statement name, then per portal at
//   Bind; a name counts by its first 63 bytes, as the server compares names: Planner.key). After
//   an Execute of a statement that ends the transaction, the fence is injected before the next
//   message that could take a snapshot (after it, when that one is a BEGIN). A fence put off for a
//   group's first message (after a BEGIN's Execute; none before a COMMIT that ends a block owing
//   one) comes before the group's first Parse or Bind of anything else (putOff): a group may parse a
//   BEGIN and run an INSERT first. Kinds, and whether a statement is a SET of a fence setting,
//   count once the backend confirms the Parse. A CALL or DO
//   executed outside a transaction block (where it could COMMIT itself) is refused: an injected
//   statement fails first (0A000), so the backend skips the rest of the pipeline up to Sync.
// - At idle a lone DISCARD, CHECKPOINT, SET / RESET of fencepost.token or fencepost.fence_key, or
//   COMMIT / ROLLBACK (a no-op there) goes unfenced (statements.ts runsUnfenced), when the server
//   lexes its text as the parser does (lexesAlike); a Query of the proxy's resets
//   default_transaction_read_only first. Everything else is fenced, so Postgres
//   refuses a statement that cannot run in a transaction block (25001): VACUUM, CLUSTER, … .
// - A Query inside an open extended group (before its Sync) ends the session: it would end the
//   group's implicit transaction mid-pipeline, and no client library sends one.
// - The kinds of statements and portals count once the backend confirms their Parse / Bind /
//   Close (relay.ts), and the relay checks each ReadyForQuery against the state predicted here.
import { isUtf8 } from 'node:buffer';
import { encode, type ClientMessage } from './wire/frontend.ts';
import { message } from './wire/framing.ts';
import { bindComplete, commandComplete, errorResponse, noData, readyForQuery } from './wire/backend.ts';
import {
  bindAndExecute,
  closeStatement,
  deferrableBegin,
  plainBegin,
  parseStatement,
  provenFence,
  readOnlyFence,
  refusalInPlaceOfFence,
  refusedFence,
  runRoutineRefusal,
  OWN_STATEMENT,
  RESET_READ_ONLY_SQL,
  ROUTINE_STATEMENT,
  type FenceStatements,
} from './proof.ts';
import type { ErrorFields } from './wire/backend.ts';
import {
  deallocatedStatements,
  hasSeveralStatements,
  isEmptyQuery,
  lexesAlike,
  lexingIsSafe,
  needsSplitting,
  parsedStatementKind,
  runsUnfenced,
  setsFenceSetting,
  splitStatements,
  startsTransactionBlock,
  statementKind,
  type StatementKind,
} from './statements.ts';
import { FEATURE_NOT_SUPPORTED, SYNTAX_ERROR } from '../../fence/index.ts';

const NUL = Buffer.from([0]);

/** The message a response answers. */
export type Kind = 'parse' | 'bind' | 'close' | 'describe' | 'execute' | 'sync' | 'query';

/** The response the backend owes for one message sent to it. */
export interface Expect {
  kind: Kind;
  /** The proxy's own message: its responses are swallowed (notices included). */
  injected: boolean;
  /** The fence statement's Execute. */
  fence?: boolean;
  /** sync/query: forward the ReadyForQuery to the writer. */
  forwardReady?: boolean;
  /** query: per statement of the text sent, true for the fence's (their responses are swallowed); later statements are the writer's. */
  plan?: boolean[];
  /** query: the statement of `plan` whose responses come now (one CommandComplete each). */
  at?: number;
  /** query: where the fence was inserted, in characters of the text sent (error positions move back). */
  insertions?: { start: number; length: number }[];
  /** An injected empty Query standing in for a refused one: the refusal to send at its ReadyForQuery. */
  refusal?: Buffer[];
  /**
   * parse/bind/close of the writer's: what the planner records once the backend confirms it
   * (ParseComplete, BindComplete, CloseComplete).
   */
  change?: KindChange;
  /**
   * sync/query of the writer's: the transaction state the planner predicts its ReadyForQuery
   * reports if nothing fails ('T' in a block, 'I' idle); absent when it cannot tell. The relay
   * ends the session when the backend says otherwise (see Relay.onReady).
   */
  predict?: 'I' | 'T';
  /** query: a lone BEGIN; if the fence after it fails, the proxy rolls the block back (as if BEGIN had failed). */
  undoBeginOnFenceError?: boolean;
  /**
   * query: the proof sent in a block as a Query of its own, every statement the proxy's, ahead of
   * the writer's Query (proofAhead). Its error is the writer's answer; `failed` is shared with the
   * writer's Query that follows, whose error (25P02, the block aborted) then is not.
   */
  proofOutcome?: { failed: boolean };
  /** query of the writer's behind a proof of its own (proofOutcome). */
  afterProof?: { failed: boolean };
  /**
   * sync/query of the writer's: a transaction may commit before its ReadyForQuery (an implicit
   * transaction's statement, a COMMIT or ROLLBACK, a kind the proxy cannot tell); execute: this
   * Execute may (a COMMIT in a block). A backend lost before the answer leaves the outcome unknown
   * (relay.ts: 08007, not 08006).
   */
  mayCommit?: boolean;
}

/** A statement's or portal's kind as the planner records it once the backend confirms the message (null: closed). */
export interface KindChange {
  of: 'statement' | 'portal';
  /** The name's key (Planner.key): its first 63 bytes as the server compares them. */
  name: string;
  kind: StatementKind | null;
  /** statement: a BEGIN the proxy may answer itself (proof.ts deferrableBegin), its tag and text. */
  begin?: HeldBeginText;
  /** A lone SET / RESET of a fence setting (setsSetting), for a statement or a portal bound from one. */
  setting?: boolean;
}

/** A lone BEGIN of the writer's the proxy may answer itself and send later: its text (proof.ts deferrableBegin took it) and tag. */
interface HeldBeginText {
  text: string;
  tag: string;
}

/**
 * Postgres keeps prepared statements and portals in hash tables keyed by the first NAMEDATALEN-1
 * (63) bytes of the name, cut byte-wise, in the server's encoding: longer names that agree on
 * those bytes are one statement to it (`Close S Y` closes X, `Parse Y` replaces it).
 */
const NAME_KEY_BYTES = 63;
/**
 * The key of a name the proxy cannot key as the server does (client_encoding converted to another
 * server encoding, a byte past ASCII within the first 63): nothing is recorded under it, its kind
 * is unknown. Keys are latin1 strings of bytes, so none holds this character.
 */
const UNTRACKED = '\u0100';

/** Messages of the proxy's own. */
export type Injection =
  /** [Parse/]Bind/Execute of the fence statements. */
  | 'fence'
  /** Close/Parse/Bind/Execute of a statement that fails (CALL or DO outside a block). */
  | 'refuseRoutine'
  /** After the writer's Sync, Close of the proxy's named statements and a Sync of its own. */
  | 'closeOwn'
  /** A Query making transactions read-only by default again. */
  | 'resetReadOnly'
  /** The writer's Query text with the fence written into it. */
  | 'fencedQuery'
  /** An empty Query standing in for a refused one behind responses still owed. */
  | 'standIn'
  /** The writer's BEGIN the proxy answered, sent in front of the next message. */
  | 'heldBegin'
  /** The proof as a Query of its own, in a block, ahead of the writer's Query (proofAhead). */
  | 'proof';

export type Step =
  /** The writer's message, as it came. */
  | { do: 'forward'; expect: Expect[] }
  | { do: 'send'; what: Injection; bytes: Buffer; expect: Expect[]; text?: string }
  /** The proxy answers the writer itself. */
  | { do: 'reply'; bytes: Buffer[] }
  /** The proxy answers the writer's BEGIN itself (the session is in a block now) and holds it for the next message. */
  | { do: 'holdBegin'; bytes: Buffer[] }
  /** The writer said goodbye. */
  | { do: 'terminate' }
  /** The writer broke the protocol. */
  | { do: 'fail'; reason: string };

/** The fence as this session sends it (proof.ts): Bind/Execute bytes, and SQL text for a Query. */
export interface SessionFence extends FenceStatements {
  /** Characters of `text`. */
  chars: number;
  /** `text` as UTF-8, made once: written in front of each Query the fence goes into. */
  textBytes: Buffer;
  /**
   * The (fence key, token) the session passed: its transactions are counted, and their proof failing
   * means a raise above it. Null: not fenced.
   */
  pair: { fenceKey: string; token: bigint } | null;
}

function sessionFenceOf(f: FenceStatements, pair: SessionFence['pair']): SessionFence {
  // Every field written out, in one order: one hidden class for every session's fence (a spread
  // made several, and the reads of `list` and `pair` on every transaction megamorphic).
  return { list: f.list, text: f.text, chars: [...f.text].length, textBytes: Buffer.from(f.text, 'utf8'), pair };
}

/** In place of the fence while writes are refused (FENCEPOST_REQUIRE_SYNC_STANDBY): proof.ts refusalInPlaceOfFence. */
export function refusalFence(): SessionFence {
  return sessionFenceOf(refusalInPlaceOfFence(), null);
}

/** The fence of a session that passed the fence of `pair` in the epoch whose oid is `epoch` (fencer.ts). */
export function provenSessionFence(pair: { fenceKey: string; token: bigint }, epoch: string): SessionFence {
  return sessionFenceOf(provenFence(pair.fenceKey, pair.token, epoch), pair);
}

/** The fence of a session without a token: read-only. */
export function readOnlySessionFence(): SessionFence {
  return sessionFenceOf(readOnlyFence(), null);
}

/** The fence of a session whose transactions the fencer refuses with `error`. */
export function refusedSessionFence(error: ErrorFields): SessionFence {
  return sessionFenceOf(refusedFence(error), null);
}

/** What the relay knows when a message is planned. */
export interface PlanContext {
  /** The last ReadyForQuery's status: 'I', 'T' or 'E'. */
  status: string;
  /** Responses to earlier messages are still to come. */
  awaiting: boolean;
}

type Extended = Extract<ClientMessage, { type: 'parse' | 'bind' | 'describe' | 'execute' | 'close' | 'sync' | 'flush' }>;

/**
 * Every Expect is built from this (`{ ...EXPECT, kind, injected, … }`): all its fields, in one
 * order, and those the relay adds when it queues it as a Reply (replies.ts replyOf), so every
 * Expect has one hidden class and becomes its Reply without a copy (literals of a dozen shapes
 * made each read megamorphic, and a copy per message sent was most of what a transaction allocated).
 */
export const EXPECT: Readonly<Expect & { capture: undefined; onReady: undefined; fenceFailed: undefined; copyEndsAt: undefined }> = {
  kind: 'sync',
  injected: false,
  fence: undefined,
  forwardReady: undefined,
  plan: undefined,
  at: undefined,
  insertions: undefined,
  refusal: undefined,
  change: undefined,
  predict: undefined,
  undoBeginOnFenceError: undefined,
  proofOutcome: undefined,
  afterProof: undefined,
  mayCommit: undefined,
  capture: undefined,
  onReady: undefined,
  fenceFailed: undefined,
  copyEndsAt: undefined,
};

const forward = (kind: Kind): Step => ({ do: 'forward', expect: [{ ...EXPECT, kind, injected: false }] });

export class Planner {
  /** The fence statement the backend's unnamed statement holds (its SQL), as far as the proxy knows; null: parse it again. */
  private unnamedFence: string | null = null;
  /** The writer may still bind its own unnamed statement: a fence must not replace it (it uses OWN_STATEMENT). */
  private writerUnnamed = false;
  /** Whether the writer's unnamed statement was live before the proxy's Parse of it still unconfirmed. */
  private writerUnnamedBeforeFence = false;
  /** The group used the proxy's named statements: close them after its Sync. */
  private ownStatementsUsed = false;
  /** The writer's message being planned (a fence in front of a Parse of the unnamed statement may replace it). */
  private current: ClientMessage | null = null;
  /**
   * The writer's BEGIN, answered by the proxy and not sent yet: it goes, with the fence, in front of
   * the next message. A Query's text (`text`), or the text of a prepared one (`prepared`), sent on a
   * statement of the proxy's: never the writer's prepared statement, which may be another by then.
   */
  private heldBegin: { text: string } | { prepared: string } | null = null;
  /** An extended group is open (up to its Sync). */
  private groupOpen = false;
  /** Extended group: fence right after the next Execute (it runs a BEGIN or … AND CHAIN). */
  private fenceAfterExecute = false;
  /** Extended group: a statement ended the transaction; fence before the next message that could take a snapshot. */
  private fenceBeforeExecute = false;
  /** Extended group: the backend is (predicted to be) inside a transaction block. */
  private inBlock = false;
  /** Extended group: it opened at idle with a SET of a fence setting, which runs unfenced; the fence comes before anything else. */
  private settingFirst = false;
  /** A held BEGIN went with a SET of a fence setting, unfenced: the block's next statement gets the fence, unless it ends the block. */
  private fenceOwedInBlock = false;
  /** Extended group: it opened with a held BEGIN and a SET of a fence setting: unless more comes in it, the block owes its fence. */
  private settingOwesBlock = false;
  /** Extended group: a BEGIN just ran; the fence goes before the group's next message (after it, if that is a SET of a fence setting). */
  private fenceAfterBegin = false;
  /**
   * Extended group: the block owes its fence and the group opened with a Parse of a COMMIT /
   * ROLLBACK; the fence comes before anything else the group parses, binds or runs (putOff).
   */
  private fenceUnlessEnd = false;
  /** Writer's statements and portals that are a lone SET of a fence setting (statements.ts setsFenceSetting). */
  private readonly settingStatements = new Set<string>();
  private readonly settingPortals = new Set<string>();
  /** Extended group: an Execute of a statement of unknown kind ran in a block; the state after it is a guess. */
  private unsure = false;
  /** Extended group: the block state as mayCommit follows it ('E': the group opened in a failed block). */
  private commitState: CommitState = 'I';
  /** Extended group: an Execute may commit a transaction by the group's Sync (Expect.mayCommit). */
  private groupMayCommit = false;
  /** The kind of each prepared statement of the writer's (by name; '' is the unnamed one), as the backend confirmed it. */
  private readonly statementKinds = new Map<string, StatementKind>();
  /** Prepared statements of the writer's that are a BEGIN the proxy may answer itself: their text and CommandComplete tag. */
  private readonly beginTags = new Map<string, HeldBeginText>();
  /** The kind of each portal's statement (by portal name), as the backend confirmed it. */
  private readonly portalKinds = new Map<string, StatementKind>();
  /** Changes of the writer's Parse, Bind and Close sent but not confirmed yet, in order: a refused message changes nothing. */
  private readonly pending: KindChange[] = [];
  /** The bytes of the Query being planned, as the writer sent them (frontend.ts). */
  private queryRaw: Buffer | undefined = undefined;
  /** ParameterStatus, for lexesAlike. */
  private standardConformingStrings = 'on';
  private clientEncoding = 'UTF8';
  /** ParameterStatus, for key. */
  private serverEncoding = 'UTF8';
  /** lexingIsSafe for the settings as reported: for lexesAlike. */
  private lexingSafe = true;
  /** The server takes names as sent, unconverted (the two encodings alike, or either SQL_ASCII): for key. */
  private namesUnconverted = true;
  /**
   * A statement of the writer's ran since the last ReadyForQuery the proxy has seen: it may have
   * changed client_encoding or standard_conforming_strings (SET, set_config()), and Postgres
   * reports that only with its ReadyForQuery. Until then lexesAlike and key take the session as
   * one that lexes and names otherwise (scs off, a converting encoding).
   */
  private settingsUnsure = false;

  /** `fence`: replaced when the forgery guard's state changes. */
  constructor(public fence: SessionFence) {}

  /** A ParameterStatus from the backend. */
  noteParameter(name: string, value: string): void {
    if (name === 'standard_conforming_strings') this.standardConformingStrings = value;
    else if (name === 'client_encoding') this.clientEncoding = value;
    else if (name === 'server_encoding') this.serverEncoding = value;
    this.lexingSafe = lexingIsSafe(this.standardConformingStrings, this.clientEncoding);
    const client = this.clientEncoding.toUpperCase();
    const server = this.serverEncoding.toUpperCase();
    this.namesUnconverted = client === server || client === 'SQL_ASCII' || server === 'SQL_ASCII';
  }

  /**
   * The key of a statement's or portal's name in the planner's maps: as the server compares names,
   * its first 63 bytes (NAME_KEY_BYTES) as sent (`bytes`; else the name's UTF-8), one latin1
   * character a byte, so bytes that are not UTF-8 stay apart. The server converts names from
   * client_encoding to its own encoding first, unless the two are the same or either is SQL_ASCII;
   * where it converts, ASCII stays itself and anything past it stays past it, so a name that is
   * ASCII in its first 63 bytes keys alike, and any other is UNTRACKED.
   */
  private key(name: string, bytes?: Buffer): string {
    if (name === '') return '';
    const b = bytes ?? Buffer.from(name, 'utf8');
    const end = Math.min(b.length, NAME_KEY_BYTES);
    let ascii = true;
    for (let i = 0; i < end && ascii; i++) if (b[i]! >= 0x80) ascii = false;
    // ASCII bytes read alike as UTF-8 and latin1: the name as decoded is the key (or its first 63).
    if (ascii) return end === name.length ? name : name.slice(0, end);
    if (this.settingsUnsure || !this.namesUnconverted) return UNTRACKED;
    return b.toString('latin1', 0, end);
  }

  /**
   * The kind of a statement about to be bound, as far as it may put the fence off. A named
   * statement may hold something else than the proxy saw parsed (SQL PREPARE and DEALLOCATE run in
   * a DO block or a function, where the proxy does not see them), so it never counts as a BEGIN or
   * a COMMIT, the kinds after which the fence comes; the unnamed one, which only the protocol
   * makes, does.
   */
  private boundKind(statementKey: string): StatementKind {
    const kind = this.kindOf('statement', statementKey) ?? 'unknown';
    return statementKey !== '' && (kind === 'begin' || kind === 'end') ? 'other' : kind;
  }

  /**
   * Does a Bind of this statement (its key) run a lone SET of a fence setting, which goes unfenced at
   * the head of a group? Only the unnamed statement is trusted so: a DO block or a function can
   * DEALLOCATE and PREPARE a named one through SPI, unseen (its tag is DO or SELECT), into an
   * INSERT or a CALL that commits, and SQL cannot touch the unnamed statement.
   */
  private bindsSetting(statementKey: string): boolean {
    return statementKey === '' && this.isSetting('statement', statementKey);
  }

  /** Does the server lex this text of the writer's as the parser does (statements.ts lexesAlike)? */
  private lexesAlike(text: string): boolean {
    // lexesAlike with the session's settings (or as with scs off and SJIS while unsure), lexingIsSafe kept.
    return (!this.settingsUnsure && this.lexingSafe) || lexesAlike(text, 'off', 'SJIS');
  }

  /**
   * A lone SET / RESET of a fence setting, as the server reads the text: the parser's answer counts
   * only where the server lexes as it does. Elsewhere what looks like one SET may be several
   * statements to the server (`SET fencepost.token = 'a\', '; INSERT …; --'` with
   * standard_conforming_strings off), and they would run without the fence.
   */
  private setsSetting(text: string): boolean {
    return this.lexesAlike(text) && setsFenceSetting(text);
  }

  /** A statement that goes unfenced at idle (statements.ts runsUnfenced), as the server reads the text. */
  private runsUnfenced(text: string): boolean {
    return this.lexesAlike(text) && runsUnfenced(text);
  }

  /**
   * The proxy's Parse of the unnamed statement failed or was skipped, or what it holds is in doubt
   * (a fence Bind's 26000, DISCARD ALL): parse it again before the next fence, and keep whatever
   * the writer's unnamed statement was.
   */
  statementsDropped(): void {
    if (this.unnamedFence !== null) this.writerUnnamed ||= this.writerUnnamedBeforeFence;
    this.unnamedFence = null;
  }

  /** The writer's prepared statements may be gone or replaced (DEALLOCATE, DISCARD ALL): their kinds are unknown from now on. */
  writerStatementsDropped(): void {
    this.statementKinds.clear();
    this.settingStatements.clear();
    this.settingPortals.clear();
    this.beginTags.clear();
    this.portalKinds.clear();
    this.pending.length = 0;
  }

  /** The backend confirmed the message that makes this change. */
  confirm(change: KindChange): void {
    const i = this.pending.indexOf(change);
    if (i < 0) return; // dropped since (an error, a DEALLOCATE): stay unknown
    this.pending.splice(i, 1);
    if (change.name === UNTRACKED) return;
    if (change.of === 'statement') {
      if (change.begin !== undefined) this.beginTags.set(change.name, change.begin);
      else this.beginTags.delete(change.name);
    }
    const kinds = change.of === 'statement' ? this.statementKinds : this.portalKinds;
    if (change.kind === null) kinds.delete(change.name);
    else kinds.set(change.name, change.kind);
    const settings = change.of === 'statement' ? this.settingStatements : this.settingPortals;
    if (change.setting === true) settings.add(change.name);
    else settings.delete(change.name);
  }

  /** The backend refused or skipped the message that makes this change: it changes nothing. */
  discard(change: KindChange): void {
    const i = this.pending.indexOf(change);
    if (i >= 0) this.pending.splice(i, 1);
  }

  /** The kind a statement or portal will have once what was sent before is confirmed. */
  private kindOf(of: KindChange['of'], name: string): StatementKind | undefined {
    if (name === UNTRACKED) return undefined;
    for (let i = this.pending.length - 1; i >= 0; i--) {
      const c = this.pending[i]!;
      if (c.of === of && c.name === name) return c.kind ?? undefined;
    }
    return (of === 'statement' ? this.statementKinds : this.portalKinds).get(name);
  }

  /**
   * Is this statement or portal a lone SET of a fence setting, once what was sent before is
   * confirmed? Counted only once the backend confirms the Parse or Bind, as kinds are: a refused
   * Parse of a taken name leaves the statement the name had.
   */
  private isSetting(of: KindChange['of'], name: string): boolean {
    for (let i = this.pending.length - 1; i >= 0; i--) {
      const c = this.pending[i]!;
      if (c.of === of && c.name === name) return c.setting === true;
    }
    return (of === 'statement' ? this.settingStatements : this.settingPortals).has(name);
  }

  /** A change the writer's message makes once confirmed. */
  private change(of: KindChange['of'], name: string, kind: StatementKind | null, begin?: HeldBeginText, setting?: boolean): KindChange {
    const c: KindChange = { of, name, kind };
    if (begin !== undefined) c.begin = begin;
    if (setting === true) c.setting = true;
    this.pending.push(c);
    return c;
  }

  private forgetStatement(name: string): void {
    this.statementKinds.delete(name);
    this.settingStatements.delete(name);
    this.beginTags.delete(name);
  }

  /**
   * At idle with nothing owed, the writer's next group (`next`, as many messages as have come) is
   * a lone BEGIN of a prepared statement, Bind/[Describe]/Execute/Sync on the unnamed portal, with
   * transaction modes or on the unnamed statement (a plain named one, pgbench's and pgx's, goes as
   * sent with the fence in front: held, it would take the unnamed statement from the fence, parsed
   * again every transaction, about 30 us of Postgres CPU, docs/performance.md): the
   * proxy answers it itself and holds the BEGIN for the next message, as it holds a BEGIN Query:
   * the text recorded when its Parse was confirmed, sent on a statement of the proxy's. Never the
   * writer's Bind/Execute of the name: by then the name may stand for another statement (a name
   * the server reads as another, a PREPARE in a DO block), which would run without the fence.
   * Returns how many messages it took and the answer, or null.
   */
  holdExtendedBegin(next: readonly ClientMessage[], ctx: PlanContext): { taken: number; reply: Buffer[] } | null {
    if (ctx.status !== 'I' || ctx.awaiting || this.groupOpen || this.heldBegin !== null || this.pending.length > 0) return null;
    if (this.beginTags.size === 0) return null;
    const b = next[0];
    if (b?.type !== 'bind' || b.portal !== '' || (b.paramFormats ?? 0) !== 0 || (b.paramCount ?? 0) !== 0) return null;
    const d = next[1];
    const e = next[2];
    const s = next[3];
    const begin = this.beginTags.get(this.key(b.statement, b.statementBytes));
    // A named BEGIN without modes goes as the writer sent it, the fence in front like any group
    // (boundKind): the fence's statement stays parsed (holding would parse it again per transaction).
    if (begin === undefined || (b.statement !== '' && plainBegin(begin.text))) return null;
    const describe = d?.type === 'describe' && d.target === 'P' && d.name === '';
    const [ex, sy] = describe ? [e, s] : [d, e];
    if (ex?.type !== 'execute' || ex.portal !== '' || sy?.type !== 'sync') return null;
    this.heldBegin = { prepared: begin.text };
    const reply = [bindComplete()];
    if (describe) reply.push(noData());
    reply.push(commandComplete(begin.tag), readyForQuery('T'));
    return { taken: describe ? 4 : 3, reply };
  }

  /**
   * A ReadyForQuery from the backend. Outside a block nothing owes a fence (a group that failed
   * before its BEGIN ran left the flag set at its Sync, and a BEGIN the proxy then held made the
   * session look in a block: the next Query's proof went ahead of it on its own, to an idle
   * backend, and the writer's INSERT after it unfenced; red team round 7). A block reported after a
   * writer's COMMIT or ROLLBACK (`writerEnded`, relay.ts) may not be the one the fence proved (SQL
   * EXECUTE of a COMMIT AND CHAIN prepared with Parse; red team round 6): its next statement gets
   * the fence, unless it ends the block (an extra proof in a transaction that has one passes).
   */
  noteReady(status: string, writerEnded: boolean): void {
    if (status !== 'T') this.fenceOwedInBlock = false;
    else if (writerEnded) this.fenceOwedInBlock = true;
  }

  /** Does this message start a new group (so it waits for the previous group's ReadyForQuery)? */
  opensGroup(m: ClientMessage): boolean {
    return m.type === 'query' || m.type === 'functionCall' || (isExtended(m) && !this.groupOpen);
  }

  /** An extended group is open (its Sync not sent yet). */
  inGroup(): boolean {
    return this.groupOpen;
  }

  /** A BEGIN of the writer's is held: the backend is idle, the writer was told it is in a block. */
  holdsBegin(): boolean {
    return this.heldBegin !== null;
  }

  /** Would this message start a transaction, if the session is idle? */
  startsTransaction(m: ClientMessage): boolean {
    return (m.type === 'query' && !this.groupOpen) || (isExtended(m) && !this.groupOpen && m.type !== 'sync' && m.type !== 'flush');
  }

  /** What to send for one of the writer's messages, in order. */
  plan(m: ClientMessage, ctx: PlanContext): Step[] {
    // Every answer in and no group open: the ParameterStatus of what ran came before its ReadyForQuery.
    if (!ctx.awaiting && !this.groupOpen) this.settingsUnsure = false;
    const steps = this.planMessage(m, ctx);
    if (m.type === 'query' || m.type === 'execute') this.settingsUnsure = true;
    return steps;
  }

  private planMessage(m: ClientMessage, ctx: PlanContext): Step[] {
    switch (m.type) {
      case 'query':
        this.queryRaw = m.raw;
        try {
          return this.planQuery(m.text, ctx);
        } finally {
          this.queryRaw = undefined;
        }
      case 'functionCall':
        if (ctx.awaiting) return [];
        return [
          {
            do: 'reply',
            bytes: [
              errorResponse({
                severity: 'ERROR',
                code: FEATURE_NOT_SUPPORTED,
                message: 'the fencepost SQL endpoint does not serve FunctionCall messages; call the function in a SELECT',
              }),
              readyForQuery(ctx.status),
            ],
          },
        ];
      case 'copy':
        return [{ do: 'forward', expect: [] }];
      case 'terminate':
        return [{ do: 'terminate' }];
      case 'other':
        return [{ do: 'fail', reason: `unexpected message type ${JSON.stringify(m.code)} from the client` }];
      default:
        return this.planExtended(m, ctx);
    }
  }

  private planQuery(text: string, ctx: PlanContext): Step[] {
    // A Query drops the backend's unnamed statement (ours or the writer's), and what it was.
    this.unnamedFence = null;
    this.writerUnnamed = false;
    this.forgetStatement('');
    // A Query inside an open extended group (asyncpg: Parse/Describe/Flush, then a Query) runs in
    // the group's transaction, and its ReadyForQuery ends the group as a Sync would. The group was
    // fenced when it began; a block it opened is continued. Where the planner cannot tell the
    // state the group left (a statement of unknown kind ran in a block, a BEGIN still to be
    // fenced), the session ends and nothing of the Query runs.
    if (this.groupOpen) {
      const owed = this.fenceAfterExecute || this.fenceAfterBegin || this.fenceBeforeExecute || this.fenceUnlessEnd;
      if (this.unsure || owed || this.settingFirst) {
        return [
          {
            do: 'fail',
            reason:
              'a Query message inside an extended-protocol group whose transaction state the fencepost SQL endpoint cannot tell: send Sync first',
          },
        ];
      }
      this.groupOpen = false;
      // Never held or answered by the proxy (a BEGIN here joins the group's transaction): responses are owed.
      ctx = { status: this.inBlock ? 'T' : ctx.status, awaiting: true };
    }
    const idle = ctx.status === 'I';
    const dropped = deallocatedStatements(text);
    // Past ASCII the name the parser read may not be the server's bytes (client_encoding): forget all.
    if (dropped === 'all' || dropped.some((name) => /[^\x00-\x7f]/.test(name))) this.writerStatementsDropped();
    else for (const name of dropped) this.forgetStatement(this.key(name));
    if (isEmptyQuery(text))
      return [{ do: 'forward', expect: [{ ...EXPECT, kind: 'query', injected: false, forwardReady: true, mayCommit: false }] }];
    const beginTag = idle && !ctx.awaiting ? deferrableBegin(text) : null;
    if (beginTag !== null) {
      this.heldBegin = { text };
      return [{ do: 'holdBegin', bytes: [commandComplete(beginTag), readyForQuery('T')] }];
    }
    if (this.heldBegin !== null && this.setsSetting(text)) {
      // A driver that sends BEGIN first (psycopg2, psycopg 3) setting a new token after a stale
      // one's FP409: the SET goes unfenced; the block's next statement gets the fence (the
      // session's verdict as it stands: the new token counts from the next transaction), unless
      // it ends the block. Set the token and commit, and the next transaction is fenced with it.
      const held = this.sendHeldBegin('query')!;
      this.fenceOwedInBlock = true;
      return [
        ...held,
        { do: 'forward', expect: [{ ...EXPECT, kind: 'query', injected: false, forwardReady: true, predict: 'T', mayCommit: false }] },
      ];
    }
    if (this.fenceOwedInBlock && ctx.status === 'T' && this.setsSetting(text)) {
      // Still owed: the SET goes first, unfenced (psycopg 3: BEGIN in a group of its own, then SET).
      return [
        { do: 'forward', expect: [{ ...EXPECT, kind: 'query', injected: false, forwardReady: true, predict: 'T', mayCommit: false }] },
      ];
    }
    if (this.fenceOwedInBlock && this.heldBegin === null) {
      // (With a BEGIN held the backend is idle: the held BEGIN goes first with the fence, below.)
      this.fenceOwedInBlock = false;
      if (ctx.status === 'T' && !isEmptyQuery(text) && !(this.runsUnfenced(text) && statementKind(text) === 'end')) {
        if (provesAhead(text)) return this.proofAhead(text);
        const planned = this.fenceQuery(text, true, 'T');
        if ('refuse' in planned) return this.refuseQuery(ctx, ...planned.refuse);
        return [
          {
            do: 'send',
            what: 'fencedQuery',
            bytes: planned.bytes ?? encode({ type: 'query', text: planned.text }),
            text: planned.text,
            expect: [planned.expect],
          },
        ];
      }
    }
    const begin = this.sendHeldBegin('query');
    if (begin !== null) {
      // The block the writer was told of opens now; the fence goes in front of the writer's text.
      // Not as a Query of the proxy's ahead of it (proofAhead), with the BEGIN: a cancel of the
      // writer's may land on that BEGIN (its signal can reach the backend after Postgres closed the
      // cancel connection, even a statement later), and the writer's Query, already sent behind
      // it, would run in a transaction of its own without the proof. Here a failed BEGIN leaves
      // the proof and the writer's statements in one implicit transaction.
      const planned = this.fenceQuery(text, true, 'T');
      if ('refuse' in planned) return [...begin, ...this.refuseQuery({ ...ctx, awaiting: true }, ...planned.refuse)];
      const step: Step = {
        do: 'send',
        what: 'fencedQuery',
        bytes: planned.bytes ?? encode({ type: 'query', text: planned.text }),
        text: planned.text,
        expect: [planned.expect],
      };
      return [...begin, step];
    }
    if (idle && this.runsUnfenced(text) && this.fence.pair !== null) {
      // A fenced session is read-write by default (fencer.ts); none of these writes data.
      return [
        { do: 'forward', expect: [{ ...EXPECT, kind: 'query', injected: false, forwardReady: true, predict: 'I', mayCommit: false }] },
      ];
    }
    if (idle && this.runsUnfenced(text)) {
      // Unfenced, so read-only: undo a writer's `SET default_transaction_read_only = off` first.
      return [
        {
          do: 'send',
          what: 'resetReadOnly',
          bytes: encode({ type: 'query', text: RESET_READ_ONLY_SQL }),
          expect: [{ ...EXPECT, kind: 'query', injected: true, forwardReady: false }],
        },
        // None of them writes data: nothing of the writer's commits.
        { do: 'forward', expect: [{ ...EXPECT, kind: 'query', injected: false, forwardReady: true, predict: 'I', mayCommit: false }] },
      ];
    }
    const planned = this.fenceQuery(text, idle, commitStateOf(ctx.status));
    if ('refuse' in planned) return this.refuseQuery(ctx, ...planned.refuse);
    if (planned.bytes === undefined) return [{ do: 'forward', expect: [planned.expect] }];
    return [
      {
        do: 'send',
        what: 'fencedQuery',
        bytes: planned.bytes ?? encode({ type: 'query', text: planned.text }),
        text: planned.text,
        expect: [planned.expect],
      },
    ];
  }

  /**
   * In a block, the proof as a Query of the proxy's, then the writer's Query as it came:
   * pipelined, no round trip more, and pg_stat_activity and current_query() show only the
   * writer's text. If the proof fails (a cancel included), the block fails, and so does the
   * writer's Query. Outside a block (and in the block a held BEGIN opens) the proof stays written
   * in front of the writer's text (fenceQuery): a Query of its own would commit at its
   * ReadyForQuery, and the writer's statements would run in another transaction.
   */
  private proofAhead(text: string): Step[] {
    const outcome = { failed: false };
    const ours = this.fence.text;
    const plan = this.fenceSlots();
    return [
      {
        do: 'send',
        what: 'proof',
        bytes: encode({ type: 'query', text: ours }),
        text: ours,
        expect: [
          {
            ...EXPECT,
            kind: 'query',
            injected: false,
            forwardReady: false,
            at: 0,
            plan,
            predict: 'T',
            mayCommit: false,
            proofOutcome: outcome,
          },
        ],
      },
      { do: 'forward', expect: [{ ...unsplitQuery(text, 'T', 'T'), afterProof: outcome }] },
    ];
  }

  /**
   * The held BEGIN, once (its responses swallowed): null when none is held. A Query's BEGIN as a
   * Query of its own. A prepared one's text as Parse/Bind/Execute of a statement of the proxy's,
   * not a Query, which would drop the writer's unnamed statement: at the head of the writer's group
   * (`before`), where the fence follows it, or with a Sync of its own before a Query. If it fails
   * (a cancel lands on it), a Query behind it still runs with the fence in front of its text, and
   * a group is skipped up to its Sync.
   */
  private sendHeldBegin(before: 'query' | 'group'): Step[] | null {
    const held = this.heldBegin;
    if (held === null) return null;
    this.heldBegin = null;
    if ('text' in held)
      return [
        {
          do: 'send',
          what: 'heldBegin',
          bytes: encode({ type: 'query', text: held.text }),
          text: held.text,
          expect: [{ ...EXPECT, kind: 'query', injected: true, forwardReady: false }],
        },
      ];
    // The unnamed statement, unless the writer's may still be bound in this group (then the proxy's own, closed after its Sync).
    const own = before === 'group' && this.writerUnnamed;
    const name = own ? OWN_STATEMENT : '';
    const bytes: Buffer[] = [];
    const expect: Expect[] = [];
    if (own) {
      this.ownStatementsUsed = true;
      bytes.push(closeStatement(OWN_STATEMENT));
      expect.push({ ...EXPECT, kind: 'close', injected: true });
    } else {
      if (this.unnamedFence === null) this.writerUnnamedBeforeFence = this.writerUnnamed;
      this.unnamedFence = null; // it holds the BEGIN now: the fence is parsed again
      this.writerUnnamed = false;
    }
    bytes.push(encode({ type: 'parse', name, text: held.prepared, paramTypes: [] }), bindAndExecute(name, []));
    expect.push(
      { ...EXPECT, kind: 'parse', injected: true },
      { ...EXPECT, kind: 'bind', injected: true },
      { ...EXPECT, kind: 'execute', injected: true },
    );
    if (before === 'query') {
      bytes.push(encode({ type: 'sync' }));
      expect.push({ ...EXPECT, kind: 'sync', injected: true, forwardReady: false });
    }
    return [{ do: 'send', what: 'heldBegin', bytes: Buffer.concat(bytes), expect }];
  }

  /** An ErrorResponse and ReadyForQuery of the proxy's for a Query it does not send. */
  private refuseQuery(ctx: PlanContext, code: string, msg: string, detail: string): Step[] {
    const reply = [errorResponse({ severity: 'ERROR', code, message: msg, detail }), readyForQuery(ctx.status)];
    if (!ctx.awaiting) return [{ do: 'reply', bytes: reply }];
    // Behind responses still to come: a Query of the proxy's that does nothing keeps the order.
    return [
      {
        do: 'send',
        what: 'standIn',
        bytes: encode({ type: 'query', text: '' }),
        expect: [{ ...EXPECT, kind: 'query', injected: true, forwardReady: false, refusal: reply }],
      },
    ];
  }

  /**
   * A writer's Query: the text to send with the fence in front of every transaction that starts
   * in it, or a refusal. `idle`: the Query starts a transaction (else it continues one).
   */
  private fenceQuery(
    text: string,
    idle: boolean,
    status: CommitState,
  ): { text: string; bytes?: Buffer; expect: Expect } | { refuse: [string, string, string] } {
    const fenceText = this.fence.text;
    // Text that is not UTF-8 (a LATIN1 or SJIS session's letters past ASCII) reads here as U+FFFD:
    // what is sent is built from the writer's bytes, never from `text`.
    // Asked for only where needed: isUtf8 reads the whole text.
    let rawMemo: Buffer | null | undefined;
    const rawOf = (): Buffer | null => {
      if (rawMemo === undefined) rawMemo = this.queryRaw !== undefined && !isUtf8(this.queryRaw) ? this.queryRaw : null;
      return rawMemo;
    };
    const query = (sent: string, ...parts: (Buffer | string)[]) =>
      rawOf() === null
        ? encode({ type: 'query', text: sent })
        : message('Q', ...parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : p)), NUL);
    const start = idle && status !== 'T' ? 'I' : 'T';
    const base = { ...EXPECT, kind: 'query' as const, injected: false, forwardReady: true, at: 0 };
    if (!needsSplitting(text)) {
      // One statement, or several without a word that could start or end a transaction.
      const predicted = unsplitQuery(text, start, status);
      if (!idle) return { text, expect: predicted };
      if (startsTransactionBlock(text) && !hasSeveralStatements(text)) {
        // A lone BEGIN …: first, so its isolation level applies; the fence right after it. A
        // client that keeps its own transaction state (psycopg2) takes an error here as a failed
        // BEGIN: the proxy rolls the block back if the fence fails, so the session is idle again.
        predicted.plan = [false, ...this.fenceSlots()];
        predicted.undoBeginOnFenceError = true;
        return {
          text: `${text}\n;${fenceText}`,
          bytes: query(`${text}\n;${fenceText}`, rawOf() ?? '', `\n;${fenceText}`),
          expect: predicted,
        };
      }
      predicted.plan = this.fenceSlots();
      predicted.insertions = [{ start: 0, length: this.fence.chars }];
      // From the writer's bytes as they came (UTF-8 or not, what `query` makes of them), not encoded again.
      const bytes =
        this.queryRaw !== undefined
          ? queryMessage(this.fence.textBytes, this.queryRaw)
          : query(`${fenceText}${text}`, fenceText, rawOf() ?? '');
      return { text: `${fenceText}${text}`, bytes, expect: predicted };
    }
    if (!this.lexesAlike(text)) {
      return {
        refuse: [
          FEATURE_NOT_SUPPORTED,
          'the fencepost SQL endpoint runs one statement per Query in this session',
          `With standard_conforming_strings = ${this.standardConformingStrings} and client_encoding = ${this.clientEncoding} the proxy cannot tell where the statements of a Query that holds a backslash or a character past ASCII end; send them one by one.`,
        ],
      };
    }
    const stmts = splitStatements(text);
    if (stmts === null) {
      return {
        refuse: [
          SYNTAX_ERROR,
          'syntax error: the fencepost SQL endpoint could not split this Query into statements',
          "PostgreSQL's parser refused the text; nothing of it was run.",
        ],
      };
    }
    const bytes = Buffer.from(text, 'utf8');
    const parts: string[] = [];
    const plan: boolean[] = [];
    const insertions: { start: number; length: number }[] = [];
    const cuts: { at: number; piece: string }[] = []; // where each fence goes, in bytes of the writer's text
    let chars = 0; // characters sent so far
    let from = 0; // bytes of the writer's text copied so far
    const copyTo = (end: number) => {
      const piece = bytes.toString('utf8', from, end);
      parts.push(piece);
      chars += [...piece].length;
      from = end;
    };
    const fence = (piece: string) => {
      cuts.push({ at: from, piece });
      parts.push(piece);
      insertions.push({ start: chars, length: [...piece].length });
      chars += [...piece].length;
      plan.push(...this.fenceSlots());
    };
    let needFence = idle;
    stmts.forEach((st, i) => {
      const next = stmts[i + 1];
      if (needFence && st.kind !== 'begin') {
        copyTo(st.start);
        fence(fenceText);
        needFence = false;
      }
      plan.push(false);
      if (needFence) {
        // A BEGIN opens this transaction: the fence right after it, so its isolation level applies.
        copyTo(next !== undefined ? next.start : bytes.length);
        fence(next !== undefined ? fenceText : `\n;${fenceText}`);
        needFence = false;
      }
      if (st.kind === 'chain') {
        // The next transaction opens right away (in a block, already read-write): fence it now.
        copyTo(next !== undefined ? next.start : bytes.length);
        fence(next !== undefined ? fenceText : `\n;${fenceText}`);
      }
      // What follows a transaction's end runs in a new transaction: fence it too.
      if (st.kind === 'end' && next !== undefined) needFence = true;
    });
    copyTo(bytes.length);
    const predicted = withPrediction(
      base,
      predictAfter(
        start,
        stmts.map((st) => st.kind),
      ),
    );
    const sent = parts.join('');
    // The cuts are offsets in the text's UTF-8 reading: in the writer's own bytes they hold up to
    // the first byte past ASCII.
    const raw = rawOf();
    const asciiBytes = raw === null ? 0 : raw.findIndex((b) => b >= 0x80);
    if (raw !== null && cuts.some((c) => c.at > asciiBytes)) {
      return {
        refuse: [
          FEATURE_NOT_SUPPORTED,
          'the fencepost SQL endpoint fences transactions inside a Query only in UTF-8 text',
          `This Query starts a transaction after a character that is not UTF-8 (client_encoding = ${this.clientEncoding}): send its statements one by one.`,
        ],
      };
    }
    const rawParts: (Buffer | string)[] = [];
    if (raw !== null) {
      let at = 0;
      for (const c of cuts) {
        rawParts.push(raw.subarray(at, c.at), c.piece);
        at = c.at;
      }
      rawParts.push(raw.subarray(at));
    }
    return {
      text: sent,
      ...(sent === text ? {} : { bytes: query(sent, ...rawParts) }),
      expect: {
        ...predicted,
        plan,
        insertions,
        mayCommit: mayCommit(
          status,
          stmts.map((st) => st.kind),
        ),
      },
    };
  }

  private planExtended(m: Extended, ctx: PlanContext): Step[] {
    this.current = m;
    try {
      return this.planExtendedMessage(m, ctx);
    } finally {
      this.current = null;
    }
  }

  private planExtendedMessage(m: Extended, ctx: PlanContext): Step[] {
    const steps: Step[] = [];
    const parsedKind = m.type === 'parse' ? parsedStatementKind(m.text) : null;
    // The names' keys, as the server tells names apart (key).
    const statementKey =
      m.type === 'parse' ? this.key(m.name, m.nameBytes) : m.type === 'bind' ? this.key(m.statement, m.statementBytes) : '';
    const portalKey = m.type === 'bind' || m.type === 'execute' ? this.key(m.portal, m.portalBytes) : '';
    if (!this.groupOpen && m.type !== 'sync' && m.type !== 'flush') {
      this.groupOpen = true;
      this.fenceBeforeExecute = false;
      this.unsure = false;
      this.inBlock = ctx.status !== 'I';
      this.commitState = commitStateOf(ctx.status);
      this.groupMayCommit = false;
      const opensWithSetting = m.type === 'parse' ? this.setsSetting(m.text) : m.type === 'bind' && this.bindsSetting(statementKey);
      const begin = this.sendHeldBegin('group');
      if (begin !== null) {
        // The block the writer was told of opens now, fenced before anything of the group; but a
        // SET of a fence setting (psycopg 3 sends it so, after its own BEGIN) goes first, unfenced.
        steps.push(...begin);
        if (opensWithSetting) {
          this.settingFirst = true;
          this.settingOwesBlock = true;
        } else {
          this.inject(steps);
        }
      }
      if (this.fenceOwedInBlock) {
        this.fenceOwedInBlock = false;
        const endsBlock = m.type === 'parse' && this.runsUnfenced(m.text) && parsedKind === 'end';
        if (ctx.status === 'T' && opensWithSetting) {
          this.settingFirst = true;
          this.settingOwesBlock = true;
        } else if (ctx.status === 'T' && endsBlock) {
          // The Parse of a COMMIT runs nothing: the fence stays owed until an Execute shows what runs.
          this.fenceUnlessEnd = true;
        } else if (ctx.status === 'T') {
          this.inject(steps);
        }
      }
      if (ctx.status === 'I') {
        // A group that opens with a BEGIN gets the fence right after its Execute; one that opens
        // with a SET of a fence setting (pgJDBC sends SET so) gets it after that SET.
        const opensWithBegin = m.type === 'parse' ? parsedKind === 'begin' : m.type === 'bind' && this.boundKind(statementKey) === 'begin';
        if (opensWithBegin) this.fenceAfterExecute = true;
        else if (opensWithSetting) this.settingFirst = true;
        else this.inject(steps);
      }
    }
    // After a COMMIT of the group, the fence must come before the next message that could take
    // a snapshot (Parse, Bind, Describe, Execute), unless that is a BEGIN: then right after it.
    switch (m.type) {
      // The kinds a Parse, Bind or Close gives a name count once the backend confirms the message
      // (Relay: ParseComplete, BindComplete, CloseComplete); later messages of the group see them
      // already, since the backend skips them if the message fails.
      case 'parse': {
        const kind = parsedKind!;
        const setting = this.setsSetting(m.text);
        this.afterBegin(setting, steps);
        if (this.settingFirst && !setting) this.settingDone(steps);
        if (this.fenceBeforeExecute && kind !== 'begin') this.fencePending(steps);
        this.putOff(kind, steps);
        if (m.name === '') {
          this.unnamedFence = null;
          this.writerUnnamed = true;
        }
        // A BEGIN the proxy may answer and hold (holdExtendedBegin): its text, sent in its place. With
        // parameter types declared the server refuses a Bind without parameters: not held.
        const tag = kind === 'begin' && m.paramTypes.length === 0 ? deferrableBegin(m.text) : null;
        const begin = tag === null ? undefined : { tag, text: m.text };
        steps.push({
          do: 'forward',
          expect: [{ ...EXPECT, kind: 'parse', injected: false, change: this.change('statement', statementKey, kind, begin, setting) }],
        });
        return steps;
      }
      case 'bind': {
        const kind = this.kindOf('statement', statementKey) ?? 'unknown';
        const setting = this.bindsSetting(statementKey);
        this.afterBegin(setting, steps);
        if (this.settingFirst && !setting) this.settingDone(steps);
        const putsOff = this.boundKind(statementKey);
        if (this.fenceBeforeExecute && putsOff !== 'begin') this.fencePending(steps);
        this.putOff(putsOff, steps);
        steps.push({
          do: 'forward',
          expect: [{ ...EXPECT, kind: 'bind', injected: false, change: this.change('portal', portalKey, kind, undefined, setting) }],
        });
        return steps;
      }
      case 'describe':
        this.afterBegin(false, steps);
        if (this.fenceBeforeExecute) this.fencePending(steps);
        steps.push(forward('describe'));
        return steps;
      case 'close':
        this.afterBegin(false, steps);
        steps.push({
          do: 'forward',
          expect: [
            {
              ...EXPECT,
              kind: 'close',
              injected: false,
              change: this.change(m.target === 'S' ? 'statement' : 'portal', this.key(m.name, m.nameBytes), null),
            },
          ],
        });
        return steps;
      case 'execute': {
        const settingPortal = this.isSetting('portal', portalKey);
        this.afterBegin(settingPortal, steps);
        if (this.settingFirst && !settingPortal) this.settingDone(steps);
        const afterSetting = this.settingFirst;
        const executed = this.kindOf('portal', portalKey) ?? 'unknown';
        this.putOff(executed, steps);
        this.fenceUnlessEnd = false; // the COMMIT ran: the block is over, and so is what it owed
        // In a block, a COMMIT commits at its Execute (a writer may wait for it before its Sync).
        const commitsHere = this.beforeExecute(executed, steps);
        steps.push({ do: 'forward', expect: [{ ...EXPECT, kind: 'execute', injected: false, mayCommit: commitsHere || undefined }] });
        if (afterSetting) {
          // The SET ran: whatever comes next in the group gets the fence first.
          this.settingFirst = false;
          this.fenceBeforeExecute = true;
        }
        if (this.fenceAfterExecute) {
          this.fenceAfterExecute = false;
          // After a BEGIN, before the next message (no snapshot is taken in between), so a SET of
          // a fence setting right after it (psycopg 3's BEGIN, then SET) can go first.
          if (executed === 'begin') this.fenceAfterBegin = true;
          else this.inject(steps);
        }
        return steps;
      }
      case 'sync': {
        // A lone Sync (no group open) changes nothing: the backend stays as its last ReadyForQuery
        // said, when nothing sent before is unanswered and no BEGIN is held (the backend is idle then).
        const lone = !this.groupOpen;
        // With a BEGIN held the writer is in the block it was told of: answered here, as Postgres would.
        if (lone && this.holdsBegin() && !ctx.awaiting) return [{ do: 'reply', bytes: [readyForQuery('T')] }];
        this.groupOpen = false;
        // Only the SET ran in the block: its next statement gets the fence, unless it ends the block.
        if ((this.settingOwesBlock && (this.settingFirst || this.fenceBeforeExecute)) || this.fenceAfterBegin || this.fenceUnlessEnd)
          this.fenceOwedInBlock = true;
        this.fenceAfterBegin = false;
        this.fenceUnlessEnd = false;
        this.settingOwesBlock = false;
        this.settingFirst = false;
        this.fenceAfterExecute = false;
        this.fenceBeforeExecute = false;
        // An implicit transaction (outside a block) commits at this Sync.
        steps.push({
          do: 'forward',
          expect: [
            withPrediction(
              { ...EXPECT, kind: 'sync', injected: false, forwardReady: true, mayCommit: this.groupMayCommit },
              lone
                ? ctx.awaiting || this.holdsBegin()
                  ? undefined
                  : ctx.status === 'I'
                    ? 'I'
                    : 'T'
                : this.unsure
                  ? undefined
                  : this.inBlock
                    ? 'T'
                    : 'I',
            ),
          ],
        });
        if (this.ownStatementsUsed) {
          // A named statement of the proxy's may be left (its Execute failed, so the backend skipped the rest).
          this.ownStatementsUsed = false;
          const bytes = Buffer.concat([closeStatement(OWN_STATEMENT), closeStatement(ROUTINE_STATEMENT), encode({ type: 'sync' })]);
          steps.push({
            do: 'send',
            what: 'closeOwn',
            bytes,
            expect: [
              { ...EXPECT, kind: 'close', injected: true },
              { ...EXPECT, kind: 'close', injected: true },
              { ...EXPECT, kind: 'sync', injected: true, forwardReady: false },
            ],
          });
        }
        return steps;
      }
      case 'flush': // no response of its own
        steps.push({ do: 'forward', expect: [] });
        return steps;
    }
  }

  /** A BEGIN ran just before this message: the fence now, or after it if it is (`setting`) a SET of a fence setting. */
  private afterBegin(setting: boolean, steps: Step[]): void {
    if (!this.fenceAfterBegin) return;
    this.fenceAfterBegin = false;
    if (setting) {
      this.settingFirst = true;
      this.settingOwesBlock = true;
    } else {
      this.inject(steps);
    }
  }

  /**
   * Before a writer's Parse, Bind or Execute of this kind: the fence the group's first message put
   * off comes now, unless this is what put it off. A group that opens with a BEGIN's Parse or Bind
   * gets the fence after that BEGIN's Execute (so an isolation level applies), and a block that
   * owes its fence, in a group that opens with a COMMIT's Parse, none if that COMMIT runs; but a
   * group may parse them and run something else first. Before its Parse or Bind, not its Execute:
   * a fence between the writer's Bind and Execute would take the unnamed portal.
   */
  private putOff(kind: StatementKind, steps: Step[]): void {
    if (this.fenceAfterExecute && kind !== 'begin') {
      this.fenceAfterExecute = false;
      this.inject(steps);
    } else if (this.fenceUnlessEnd && kind !== 'end') {
      this.fenceUnlessEnd = false;
      this.inject(steps);
    }
  }

  /** The group's first statement was not (only) a fence setting's SET: the fence now. */
  private settingDone(steps: Step[]): void {
    this.settingFirst = false;
    this.inject(steps);
  }

  private fencePending(steps: Step[]): void {
    this.fenceBeforeExecute = false;
    this.inject(steps);
  }

  /**
   * Before a writer's Execute in an extended group: fence the transaction a COMMIT earlier in the
   * group left behind, refuse a CALL or DO outside a block, and predict the block state after it.
   * A prediction that an error makes wrong does not matter: the backend skips the rest to Sync.
   * True when this Execute itself may commit (a COMMIT in a block; outside one the Sync commits).
   */
  private beforeExecute(kind: StatementKind, steps: Step[]): boolean {
    const commits = mayCommit(this.commitState, [kind]);
    if (commits) this.groupMayCommit = true;
    const commitsHere = commits && this.commitState === 'T';
    this.commitState = commitStateAfter(this.commitState, kind);
    if (this.fenceBeforeExecute) {
      this.fenceBeforeExecute = false;
      if (kind === 'begin') this.fenceAfterExecute = true;
      else this.inject(steps);
    }
    if ((kind === 'routine' || kind === 'unknown') && !this.inBlock) {
      this.ownStatementsUsed = true;
      const expect: Expect[] = [
        { ...EXPECT, kind: 'close', injected: true },
        { ...EXPECT, kind: 'parse', injected: true },
        { ...EXPECT, kind: 'bind', injected: true },
        { ...EXPECT, kind: 'execute', injected: true },
      ];
      steps.push({ do: 'send', what: 'refuseRoutine', bytes: runRoutineRefusal(), expect });
    }
    if (kind === 'begin') this.inBlock = true;
    // The next transaction opens right away, in a block: fence it right after this Execute.
    if (kind === 'chain') this.fenceAfterExecute = true;
    if (kind === 'end') {
      this.inBlock = false;
      this.fenceBeforeExecute = true;
    }
    // A statement the proxy cannot classify may have ended the block (outside one it was refused
    // above): fence before the next message as after a COMMIT, and check nothing at the Sync.
    if (kind === 'unknown') {
      this.fenceBeforeExecute = true;
      this.unsure = true;
    }
    return commitsHere;
  }

  /** The fence's statements in a Query's plan (true: swallowed). */
  private fenceSlots(): true[] {
    return new Array<true>(this.fence.list.length).fill(true);
  }

  /**
   * The fence, in front of what the writer sends next. Each statement goes on the unnamed
   * statement: Bind/Execute alone while it still holds it, Parse first otherwise. When the writer's
   * own unnamed statement must survive (it was parsed earlier and this message does not replace
   * it), on OWN_STATEMENT instead, closed before its Parse and after the group's Sync.
   */
  private inject(steps: Step[]): void {
    const m = this.current;
    const replacesUnnamed = m?.type === 'parse' && m.name === '';
    const own = this.writerUnnamed && !replacesUnnamed;
    const bytes: Buffer[] = [];
    const expect: Expect[] = [];
    const list = this.fence.list;
    for (let i = 0; i < list.length; i++) {
      const st = list[i]!;
      const last = i === list.length - 1;
      if (own) {
        this.ownStatementsUsed = true;
        bytes.push(closeStatement(OWN_STATEMENT), parseStatement(OWN_STATEMENT, st), bindAndExecute(OWN_STATEMENT, st.values));
        expect.push({ ...EXPECT, kind: 'close', injected: true }, { ...EXPECT, kind: 'parse', injected: true });
      } else {
        if (this.unnamedFence !== st.sql) {
          if (this.unnamedFence === null) this.writerUnnamedBeforeFence = this.writerUnnamed;
          bytes.push(parseStatement('', st));
          expect.push({ ...EXPECT, kind: 'parse', injected: true });
          this.unnamedFence = st.sql;
          this.writerUnnamed = false;
        }
        bytes.push(st.bound);
      }
      expect.push({ ...EXPECT, kind: 'bind', injected: true }, { ...EXPECT, kind: 'execute', injected: true, fence: last || undefined });
    }
    steps.push({ do: 'send', what: 'fence', bytes: bytes.length === 1 ? bytes[0]! : Buffer.concat(bytes), expect });
  }
}

/** The block state after statements of these kinds run from `start`; undefined when one is unknown. */
function predictAfter(start: 'I' | 'T', kinds: readonly StatementKind[]): 'I' | 'T' | undefined {
  let state: 'I' | 'T' = start;
  for (const k of kinds) {
    if (k === 'unknown') return undefined;
    if (k === 'begin' || k === 'chain') state = 'T';
    else if (k === 'end') state = 'I';
  }
  return state;
}

/**
 * What a writer's Query that needs no splitting (needsSplitting) is expected to answer, sent from
 * block state `start` as it came: the state its ReadyForQuery reports, and whether it may commit.
 */
function unsplitQuery(text: string, start: 'I' | 'T', status: CommitState): Expect {
  const kind = statementKind(text);
  const e: Expect = { ...EXPECT, kind: 'query', injected: false, forwardReady: true, at: 0, mayCommit: mayCommit(status, [kind]) };
  return withPrediction(e, predictAfter(start, [kind]));
}

/**
 * May the proof go ahead of this Query as a Query of its own (proofAhead)? When its statements all
 * run in the block the proof opens or continues: none starts or ends a transaction in a way that
 * would need a fence of its own (needsSplitting), and it is not a BEGIN or empty.
 */
function provesAhead(text: string): boolean {
  return !needsSplitting(text) && !startsTransactionBlock(text) && !isEmptyQuery(text);
}

/** The block state as mayCommit follows it: idle (an implicit transaction), in a block, in a failed block. */
type CommitState = 'I' | 'T' | 'E';

function commitStateOf(status: string): CommitState {
  return status === 'T' ? 'T' : status === 'E' ? 'E' : 'I';
}

/**
 * Can statements of these kinds, run from `start`, commit a transaction? Conservative: a statement
 * outside a block runs in an implicit transaction that commits; in a block a COMMIT or ROLLBACK
 * (the kinds do not tell them apart) or a kind the proxy cannot tell may; in a failed block only
 * what follows its ROLLBACK can (anything else fails, and the rest of a Query is skipped).
 */
function mayCommit(start: CommitState, kinds: readonly StatementKind[]): boolean {
  let state = start;
  for (const k of kinds) {
    if (state === 'I' && k !== 'begin') return true;
    if (state === 'T' && (k === 'end' || k === 'chain' || k === 'unknown')) return true;
    if (state === 'E' && k !== 'end' && k !== 'chain') return false;
    state = commitStateAfter(state, k);
  }
  return false;
}

function commitStateAfter(state: CommitState, k: StatementKind): CommitState {
  if (k === 'begin') return state === 'I' ? 'T' : state;
  if (k === 'chain') return 'T';
  if (k === 'end') return 'I';
  return state;
}

/** `e` (made for this call) with its prediction, if any. */
/** A Query message of `head` then `tail` (the statement text's bytes, no NUL). */
function queryMessage(head: Buffer, tail: Buffer): Buffer {
  const length = 4 + head.length + tail.length + 1;
  const out = Buffer.allocUnsafe(1 + length);
  out[0] = 0x51; // 'Q'
  out.writeInt32BE(length, 1);
  head.copy(out, 5);
  tail.copy(out, 5 + head.length);
  out[length] = 0;
  return out;
}

function withPrediction<T extends Expect>(e: T, predict: 'I' | 'T' | undefined): T {
  if (predict !== undefined) e.predict = predict;
  return e;
}

function isExtended(m: ClientMessage): m is Extended {
  return (
    m.type === 'parse' ||
    m.type === 'bind' ||
    m.type === 'describe' ||
    m.type === 'execute' ||
    m.type === 'close' ||
    m.type === 'sync' ||
    m.type === 'flush'
  );
}
