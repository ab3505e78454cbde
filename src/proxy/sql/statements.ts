// What kind of statement a writer sends, by the real PostgreSQL parser (libpg-query: the server's
// own grammar, PostgreSQL 18, compiled to WASM): enough to see where a transaction ends inside a
// multi-statement Query or an extended-protocol pipeline, so the proxy can fence the transaction
// that starts there (see planner.ts). Dollar quotes, nested comments, E'' strings and `BEGIN
// ATOMIC` bodies are the parser's business, not a regular expression's.
//
// The parser lexes as a session with standard_conforming_strings = on in a client encoding whose
// bytes never hide an ASCII quote (UTF8, the single-byte encodings, EUC_*). A session that turns
// the first off or picks SJIS, BIG5, GBK, UHC or GB18030 could make the server split its text
// elsewhere, where the text holds a backslash or a character past ASCII (lexesAlike): such a
// multi-statement Query is refused, and such text never goes unfenced.
import { loadModule, parseSync } from 'libpg-query';

await loadModule();

/**
 * - `begin`: BEGIN / START TRANSACTION (opens a block inside the current transaction).
 * - `end`: COMMIT / END / ROLLBACK / ABORT (with or without AND CHAIN), PREPARE TRANSACTION: what
 *   follows runs in another transaction.
 * - `chain`: COMMIT / ROLLBACK … AND CHAIN: the next transaction opens right away, in a block.
 * - `routine`: CALL and DO: a procedure or DO block may COMMIT inside itself unless it runs in a
 *   transaction block (then Postgres refuses: `invalid transaction termination`).
 * - `unknown`: the parser refused the text.
 */
export type StatementKind = 'begin' | 'end' | 'chain' | 'routine' | 'other' | 'unknown';

export interface Statement {
  kind: StatementKind;
  /** Byte offset of the statement in the UTF-8 text (after the previous `;`). */
  start: number;
}

/** Any statement of these kinds contains one of these words: text without them needs no parser. */
const TRANSACTION_WORDS = /\b(?:begin|start|commit|end|rollback|abort|prepare|call|do)\b/i;
/** And begins with one of them: a lone statement that begins with another word is of kind `other`. */
const TRANSACTION_LEADS = new Set(['begin', 'start', 'commit', 'end', 'rollback', 'abort', 'prepare', 'call', 'do']);

/**
 * The first word of a text, lowercased, as the server's lexer reads it after blanks and comments
 * (`--` to the end of the line, nested `/* … *\/`); null when the text does not begin with a plain
 * ASCII word that way (a quote, a parenthesis, a `;`, a non-ASCII byte, an unterminated comment).
 * A statement's kind follows from its first word, so a lone statement whose first word is not
 * one the question is about needs no parser: an UPDATE's `SET` or an upsert's `DO` is not a SET
 * statement or a DO block (the parser costs tens of µs a statement, and a simple-protocol text
 * with literals in it is new every time). Where the server would read a longer word (a non-ASCII
 * byte follows) or something else first, null sends the text to the parser.
 */
export function leadWord(sql: string): string | null {
  // A Query's text is asked about several times while it is planned: the last answer is kept.
  if (sql === leadMemo.sql) return leadMemo.word;
  const word = readLeadWord(sql);
  if (sql.length > MEMO_MAX_CHARS) return word;
  leadMemo.sql = sql;
  leadMemo.word = word;
  return word;
}
/** Longer texts are not kept for the next question. */
const MEMO_MAX_CHARS = 64 * 1024;
const leadMemo: { sql: string | null; word: string | null } = { sql: null, word: null };

function readLeadWord(sql: string): string | null {
  const i = pastBlanks(sql, false);
  if (i === null) return null;
  WORD.lastIndex = i;
  const m = WORD.exec(sql);
  if (m === null || sql.charCodeAt(WORD.lastIndex) >= 0x80) return null;
  return m[0].toLowerCase();
}
const WORD = /[A-Za-z_][A-Za-z0-9_$]*/y;

/**
 * Does a Query hold no statement (only blanks, comments and `;`, as the server's lexer reads
 * them)? Then it gets an EmptyQueryResponse, which the writer must see, and nothing to fence.
 * Anything else is fenced: a `--` comment ends at `\r` too, so `-- x\rINSERT …` holds an INSERT.
 */
export function isEmptyQuery(sql: string): boolean {
  return pastBlanks(sql, true) === sql.length;
}

/**
 * Where the first token of `sql` starts, past blanks and comments (`--` to the end of the line,
 * `\n` or `\r`; nested `/* … *\/`), and past `;` when `semicolons`; null inside an unterminated
 * comment (the server refuses the text).
 */
function pastBlanks(sql: string, semicolons: boolean): number | null {
  const n = sql.length;
  let i = 0;
  for (;;) {
    const c = sql.charCodeAt(i);
    if (c === 0x20 || (c >= 0x09 && c <= 0x0d) || (semicolons && c === 0x3b)) i++;
    else if (c === 0x2d && sql.charCodeAt(i + 1) === 0x2d) {
      i += 2;
      while (i < n && sql.charCodeAt(i) !== 0x0a && sql.charCodeAt(i) !== 0x0d) i++;
    } else if (c === 0x2f && sql.charCodeAt(i + 1) === 0x2a) {
      i += 2;
      for (let depth = 1; depth > 0;) {
        if (i >= n) return null;
        const d = sql.charCodeAt(i);
        if (d === 0x2f && sql.charCodeAt(i + 1) === 0x2a) {
          depth++;
          i += 2;
        } else if (d === 0x2a && sql.charCodeAt(i + 1) === 0x2f) {
          depth--;
          i += 2;
        } else i++;
      }
    } else return i;
  }
}

/**
 * A friendly guess, not a boundary: does this statement text start a transaction block (BEGIN,
 * START TRANSACTION)? Its first word, read as the server's lexer reads it (leadWord). Then the
 * fence goes right after it, so `BEGIN ISOLATION LEVEL …` still comes first. A wrong guess costs
 * an error (25001), never an unfenced write: an unfenced transaction is read-only.
 */
export function startsTransactionBlock(sql: string): boolean {
  const w = leadWord(sql);
  return w === 'begin' || w === 'start';
}

/** Does `sql` hold at most one statement, led by a word other than these? Then no parser is needed to say it is none of them. */
function loneStatementLedByOther(sql: string, leads: ReadonlySet<string>): boolean {
  const w = leadWord(sql);
  return w !== null && !leads.has(w) && !hasSeveralStatements(sql);
}
/** A lone statement needs the parser only if it could chain a transaction. */
const CHAIN_WORD = /\bchain\b/i;

interface RawStmt {
  stmt?: Record<string, { kind?: string } | undefined>;
  stmt_location?: number;
}

function kindOf(node: RawStmt['stmt']): StatementKind {
  if (node === undefined) return 'other';
  if ('CallStmt' in node || 'DoStmt' in node) return 'routine';
  const tx = node.TransactionStmt;
  if (tx === undefined) return 'other';
  if ((tx as { chain?: boolean }).chain === true) return 'chain';
  switch (tx.kind) {
    case 'TRANS_STMT_BEGIN':
    case 'TRANS_STMT_START':
      return 'begin';
    case 'TRANS_STMT_COMMIT':
    case 'TRANS_STMT_ROLLBACK':
    case 'TRANS_STMT_PREPARE':
      return 'end';
    default: // SAVEPOINT, RELEASE, ROLLBACK TO, COMMIT/ROLLBACK PREPARED (never in a block)
      return 'other';
  }
}

/**
 * Parse trees of recent texts. A session in the simple protocol sends the same COMMIT (or other
 * short statement) in every transaction; the parse is a pure function of the text, and the trees
 * are only read. Bounded: texts up to CACHED_TEXT_CHARS, CACHED_TEXTS of them, the oldest dropped.
 */
const CACHED_TEXTS = 256;
const CACHED_TEXT_CHARS = 1024;
const parsed = new Map<string, readonly RawStmt[] | null>();
/**
 * The last longer text and its parse: the planner asks several questions of one Query or Parse
 * (statementKind, runsUnfenced, setsFenceSetting, deallocatedStatements), and the parser's
 * per-byte cost (UTF-8 into WASM, the tree out as JSON) is large: ~150 ms a MB on a busy box. One
 * text's worth of memory, held until the next long text.
 */
let lastLong: { sql: string; stmts: readonly RawStmt[] | null } | null = null;

function splitNodes(sql: string): readonly RawStmt[] | null {
  const cacheable = sql.length <= CACHED_TEXT_CHARS;
  if (cacheable) {
    const hit = parsed.get(sql);
    if (hit !== undefined) return hit;
  } else if (lastLong !== null && lastLong.sql === sql) {
    return lastLong.stmts;
  }
  let stmts: readonly RawStmt[] | null;
  try {
    stmts = (parseSync(sql) as { stmts?: RawStmt[] }).stmts ?? [];
  } catch {
    stmts = null;
  }
  if (cacheable) {
    if (parsed.size >= CACHED_TEXTS) parsed.delete(parsed.keys().next().value!);
    parsed.set(sql, stmts);
  } else {
    lastLong = { sql, stmts };
  }
  return stmts;
}

/** The statements of a text, or null when the parser refuses it. */
export function splitStatements(sql: string): Statement[] | null {
  const stmts = splitNodes(sql);
  if (stmts === null) return null;
  return stmts.map((s) => ({ kind: kindOf(s.stmt), start: s.stmt_location ?? 0 }));
}

/**
 * The kind of one extended-protocol statement (Parse holds one; with more the server refuses it).
 * The worst kind wins when the parser sees several: routine, unknown, end, begin, other.
 */
export function statementKind(sql: string): StatementKind {
  if (loneStatementLedByOther(sql, TRANSACTION_LEADS) || !TRANSACTION_WORDS.test(sql)) return 'other';
  const stmts = splitStatements(sql);
  if (stmts === null) return 'unknown';
  const kinds = new Set(stmts.map((s) => s.kind));
  for (const k of ['routine', 'unknown', 'chain', 'end', 'begin'] as const) if (kinds.has(k)) return k;
  return 'other';
}

/**
 * The kind of a Parse's text. The server takes one statement there and refuses more, so text the
 * parser splits in several is either refused by the server too (nothing runs) or one statement to
 * a server that lexes it otherwise (a backslash with standard_conforming_strings off, SJIS): never
 * the worst of the parser's kinds (`INSERT … 'x\'; BEGIN; -- '` would read as a BEGIN, after which
 * the fence comes), but unknown.
 */
export function parsedStatementKind(sql: string): StatementKind {
  if (loneStatementLedByOther(sql, TRANSACTION_LEADS) || !TRANSACTION_WORDS.test(sql)) return 'other';
  const stmts = splitStatements(sql);
  if (stmts === null || stmts.length > 1) return 'unknown';
  return stmts[0]?.kind ?? 'other';
}

/**
 * A lone `SET` / `RESET` of fencepost.token or fencepost.fence_key (not SET LOCAL), by the parser:
 * it writes nothing, and a session whose token went stale sets its new one with it, so it goes
 * unfenced wherever it starts a transaction (runsUnfenced; planner.ts for the extended protocol
 * and after a BEGIN).
 */
export function setsFenceSetting(sql: string): boolean {
  if (sql.length > MAX_UNFENCED_CHARS || !/\b(?:set|reset)\b/i.test(sql) || !/fencepost/i.test(sql)) return false;
  if (loneStatementLedByOther(sql, SETTING_LEADS)) return false;
  const stmts = splitNodes(sql);
  if (stmts === null || stmts.length !== 1) return false;
  const set = (stmts[0]!.stmt ?? {}).VariableSetStmt as { kind?: string; name?: string; is_local?: boolean } | undefined;
  if (set === undefined) return false;
  return (
    set.is_local !== true &&
    ['VAR_SET_VALUE', 'VAR_SET_DEFAULT', 'VAR_RESET'].includes(set.kind ?? '') &&
    FENCE_SETTINGS.has((set.name ?? '').toLowerCase())
  );
}

/**
 * Longer texts are never a statement that runs unfenced (runsUnfenced, setsFenceSetting): a SET
 * of a valid fence key (at most MAX_KEY_BYTES) or token, a DISCARD or a COMMIT fits many times
 * over, and a longer one is fenced like any other statement (the safe side: at worst the fence
 * refuses it) without the parser reading megabytes of it. A huge `SET fencepost.token = '…'` is
 * then refused by the fencer's size check at the next transaction (fencer.ts).
 */
export const MAX_UNFENCED_CHARS = 16 * 1024;

/** Words of the only statements that run unfenced (see runsUnfenced), and their first words. */
const UNFENCED_WORDS = /\b(?:discard|checkpoint|set|reset|commit|end|rollback|abort)\b/i;
const UNFENCED_LEADS = new Set(['discard', 'checkpoint', 'set', 'reset', 'commit', 'end', 'rollback', 'abort']);
const SETTING_LEADS = new Set(['set', 'reset']);
/** The session settings the fence is decided from (fencer.ts). */
const FENCE_SETTINGS = new Set(['fencepost.token', 'fencepost.fence_key']);

/**
 * A lone statement, by the parser, that writes none of the writer's data and starts no transaction
 * of its own: the only statements the endpoint sends without the fence, and only when the session
 * is idle (planner.ts). Each runs in an implicit transaction of its own, read-only by default:
 * - DISCARD (`DISCARD ALL` cannot run in a transaction block) and CHECKPOINT;
 * - `SET` / `RESET` of fencepost.token or fencepost.fence_key (not SET LOCAL): a new leader sets
 *   its new token on a session whose old one went stale, and a fence refusing the SET would keep
 *   it stale; the setting applies from the next transaction, which the fence checks with it;
 * - COMMIT / END / ROLLBACK / ABORT without AND CHAIN: at idle they end nothing (a warning), and
 *   a client that cleans up after a failed BEGIN must not meet the fence again.
 * Every other statement is fenced, so Postgres itself refuses one that cannot run in a block
 * (VACUUM, CLUSTER, REINDEX DATABASE, … CONCURRENTLY, CREATE DATABASE, ALTER SYSTEM, COMMIT
 * PREPARED: 25001): no transaction of a session escapes its fence.
 */
export function runsUnfenced(sql: string): boolean {
  if (sql.length > MAX_UNFENCED_CHARS || loneStatementLedByOther(sql, UNFENCED_LEADS) || !UNFENCED_WORDS.test(sql)) return false;
  const stmts = splitNodes(sql);
  if (stmts === null || stmts.length !== 1) return false;
  const node = stmts[0]!.stmt ?? {};
  if ('DiscardStmt' in node || 'CheckPointStmt' in node) return true;
  if (node.VariableSetStmt !== undefined) return setsFenceSetting(sql);
  const tx = node.TransactionStmt as { kind?: string; chain?: boolean } | undefined;
  return tx !== undefined && tx.chain !== true && (tx.kind === 'TRANS_STMT_COMMIT' || tx.kind === 'TRANS_STMT_ROLLBACK');
}

/**
 * The writer's prepared statements a Query's text drops (DEALLOCATE name), or 'all' (DEALLOCATE
 * ALL, DISCARD ALL, or text the parser refuses that mentions either): the planner forgets their
 * kinds, so a statement of the same name made later by SQL PREPARE counts as unknown.
 */
export function deallocatedStatements(sql: string): string[] | 'all' {
  if (loneStatementLedByOther(sql, DEALLOCATE_LEADS) || !/\b(?:deallocate|discard)\b/i.test(sql)) return [];
  const stmts = splitNodes(sql);
  if (stmts === null) return 'all';
  const names: string[] = [];
  for (const s of stmts) {
    const node = s.stmt ?? {};
    const dealloc = node.DeallocateStmt as { name?: string; isall?: boolean } | undefined;
    if (dealloc !== undefined) {
      if (dealloc.isall === true || dealloc.name === undefined) return 'all';
      names.push(dealloc.name);
    }
    if ((node.DiscardStmt as { target?: string } | undefined)?.target === 'DISCARD_ALL') return 'all';
  }
  return names;
}

const DEALLOCATE_LEADS = new Set(['deallocate', 'discard']);

/** Can a multi-statement Query text need splitting? (A `;` with something after it.) */
export function hasSeveralStatements(sql: string): boolean {
  if (sql === severalMemo.sql) return severalMemo.several;
  const several = sql.includes(';') && /;\s*\S/.test(sql);
  if (sql.length > MEMO_MAX_CHARS) return several;
  severalMemo.sql = sql;
  severalMemo.several = several;
  return several;
}
const severalMemo: { sql: string | null; several: boolean } = { sql: null, several: false };

/**
 * Does this Query text need the parser: several statements one of which may start or end a
 * transaction, or a lone one that may chain one?
 */
export function needsSplitting(sql: string): boolean {
  return (hasSeveralStatements(sql) || CHAIN_WORD.test(sql)) && TRANSACTION_WORDS.test(sql);
}

const UNSAFE_ENCODINGS = new Set(['sjis', 'shift_jis_2004', 'big5', 'gbk', 'uhc', 'gb18030']);

/** Does the server lex any text of this session as the parser here does? */
export function lexingIsSafe(standardConformingStrings: string, clientEncoding: string): boolean {
  return standardConformingStrings.toLowerCase() === 'on' && !UNSAFE_ENCODINGS.has(clientEncoding.toLowerCase().replace(/[^a-z0-9_]/g, ''));
}

/**
 * Does the server lex this text as the parser here does? In any session, when the text has no
 * backslash (what standard_conforming_strings = off reads differently, in '' strings) and no
 * character past ASCII (in SJIS, BIG5, GBK, UHC and GB18030 a byte after a lead byte may be a quote
 * or a backslash to the parser here and part of a character to the server; every byte below 0x80
 * is the ASCII character in all of them). Text that is not UTF-8 decodes to U+FFFD, past ASCII too.
 */
export function lexesAlike(sql: string, standardConformingStrings: string, clientEncoding: string): boolean {
  return lexingIsSafe(standardConformingStrings, clientEncoding) || !/[\\\u0080-\uffff]/.test(sql);
}
