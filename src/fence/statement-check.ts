// The friendly early refusal of POST /v1/transactions (transaction.ts).
// First words that would end, split or escape the transaction, or change the session or role:
// refused before anything is sent, as a friendly early error. Safety does not rest on this: the
// login's privileges and the checks in runAttempt hold whatever the text says.
const REFUSED_FIRST_WORDS = new Set([
  'begin',
  'start',
  'commit',
  'end',
  'rollback',
  'abort',
  'savepoint',
  'release',
  'prepare',
  'set',
  'reset',
  'do',
  'copy',
  'listen',
  'discard',
]);

/** Why a statement is refused before it is sent, or null. A convenience, not a boundary. */
export function refusedStatement(sql: string): string | null {
  if (sql.includes('\u0000')) return 'contains a NUL character';
  if (/set_config/i.test(sql)) return 'calls set_config';
  let i = 0;
  for (;;) {
    while (i < sql.length && /\s/.test(sql[i]!)) i++;
    if (sql.startsWith('--', i)) {
      const nl = sql.slice(i).search(/[\n\r]/);
      i = nl < 0 ? sql.length : i + nl + 1;
    } else if (sql.startsWith('/*', i)) {
      let depth = 1;
      i += 2;
      while (i < sql.length && depth > 0) {
        if (sql.startsWith('/*', i)) {
          depth++;
          i += 2;
        } else if (sql.startsWith('*/', i)) {
          depth--;
          i += 2;
        } else i++;
      }
    } else break;
  }
  const word = /^[A-Za-z_]+/.exec(sql.slice(i))?.[0]?.toLowerCase();
  if (word !== undefined && REFUSED_FIRST_WORDS.has(word)) return `starts with ${word.toUpperCase()}`;
  return null;
}
