// The planner's statement questions (statements.ts) answered from a text's first word where that
// suffices, without the parser: the answers must be the parser's.
import { describe, expect, test } from 'vitest';
import {
  deallocatedStatements,
  isEmptyQuery,
  leadWord,
  parsedStatementKind,
  runsUnfenced,
  setsFenceSetting,
  splitStatements,
  startsTransactionBlock,
  statementKind,
} from '../../../src/proxy/sql/statements.ts';

describe('first words', () => {
  test('leadWord reads past blanks and comments as the server lexes them, and gives up where it cannot', () => {
    expect(leadWord('  \t\r\n\f\vUpdate t SET a = 1')).toBe('update');
    expect(leadWord('-- commit\nselect 1')).toBe('select');
    expect(leadWord('-- commit\rCOMMIT')).toBe('commit');
    expect(leadWord('/* a /* b */ select */ commit')).toBe('commit');
    expect(leadWord('/*/ x */ do $$ $$')).toBe('do');
    expect(leadWord('/**/set x = 1')).toBe('set');
    expect(leadWord('set$1')).toBe('set$1');
    expect(leadWord("DO'x'")).toBe('do');
    // Not a plain ASCII word first: the parser decides.
    for (const text of ['', '   ', '/* unterminated', '(SELECT 1)', ';COMMIT', '"commit"', 'sét x', 'COMMITé', '\u00a0COMMIT', '$$x$$'])
      expect(leadWord(text)).toBeNull();
  });

  test('every question answered from the first word is answered as the parser answers it', () => {
    // Invariant: f(text) === f(';' + text) for each question f, for every text the parser takes. A
    // leading `;` gives no first word, so the second call always asks the parser (it drops the empty
    // statement); the first may not. (Texts it refuses: the next test.)
    const statements = [
      'BEGIN',
      'begin work',
      'START TRANSACTION ISOLATION LEVEL SERIALIZABLE',
      'COMMIT',
      'COMMIT AND CHAIN',
      'END',
      'ROLLBACK',
      'ABORT',
      "PREPARE TRANSACTION 'x'",
      "COMMIT PREPARED 'x'",
      'CALL p(1)',
      'DO $$ BEGIN NULL; END $$',
      "DO 'BEGIN NULL; END'",
      // A `$` continues a word: `DO$$` is an identifier to the server, not DO (a syntax error).
      'DO$$ BEGIN NULL; END $$',
      "DO'BEGIN NULL; END'",
      'COMMIT$1',
      'DISCARD ALL',
      'DISCARD PLANS',
      'CHECKPOINT',
      'SET fencepost.token = 5',
      `set "fencepost.fence_key" to 'a'`,
      'RESET fencepost.token',
      'SET LOCAL fencepost.token = 1',
      'SET SESSION fencepost.token = 2',
      'SET search_path = x',
      'DEALLOCATE ALL',
      'DEALLOCATE PREPARE p1',
      'PREPARE p AS SELECT 1',
      'SAVEPOINT a',
      "UPDATE t SET a = 1 WHERE b = 'commit'",
      'INSERT INTO t AS c (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = c.n + 1',
      'INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING',
      "SELECT 'begin; commit'",
      'SELECT $$ discard all $$',
      "SELECT set_config('fencepost.token', '1', false)",
      'CREATE RULE r AS ON INSERT TO t DO INSTEAD NOTHING',
      'ALTER TABLE t SET SCHEMA s',
      'EXPLAIN UPDATE t SET fencepost = 1',
      'WITH x AS (SELECT 1) SELECT * FROM x',
      "NOTIFY fencepost, 'discard'",
      'COMMIT garbage',
    ];
    const prefixes = [
      '',
      ' ',
      '\t\n',
      '\r',
      '\f',
      '\v',
      '-- c\n',
      '-- commit\r',
      '/* c */',
      '/* a /* b */ select */ ',
      '/* a /* b */ begin */ ',
      '/*/ x */',
      ' /**/ ',
    ];
    const suffixes = ['', ';', ' ;  ', ';\n', ' -- tail', ' /* commit */'];
    const questions = { statementKind, runsUnfenced, setsFenceSetting, deallocatedStatements };
    let checked = 0;
    for (const statement of statements)
      for (const text of [statement, statement.toLowerCase(), statement.toUpperCase()])
        for (const prefix of prefixes)
          for (const suffix of suffixes) {
            const t = prefix + text + suffix;
            if (splitStatements(t) === null) continue;
            for (const [name, f] of Object.entries(questions)) expect({ name, t, answer: f(t) }).toEqual({ name, t, answer: f(`;${t}`) });
            // Where the fence goes in a Query (planner.ts): after the statement exactly when it is a BEGIN.
            expect({ t, begins: startsTransactionBlock(t) }).toEqual({ t, begins: statementKind(`;${t}`) === 'begin' });
            checked++;
          }
    expect(checked).toBeGreaterThan(4000);
    // A Query gets no fence exactly when the parser finds no statement in it (planner.ts).
    for (const prefix of prefixes)
      for (const suffix of suffixes)
        for (const middle of ['', ';', 'SELECT 1', '/* x */', '-- y\r', 'COMMIT']) {
          const t = prefix + middle + suffix;
          const found = splitStatements(t);
          if (found !== null) expect({ t, empty: isEmptyQuery(t) }).toEqual({ t, empty: found.length === 0 });
        }
    expect(isEmptyQuery('-- x\rINSERT INTO t VALUES (1)')).toBe(false);
    expect(isEmptyQuery('/* a /* b */ */')).toBe(true);
    // The questions the first word answers, answered: none of these asks the parser for a kind.
    expect(statementKind('INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING')).toBe('other');
    expect(runsUnfenced('UPDATE t SET a = 1')).toBe(false);
    expect(statementKind('/* a /* b */ select */ COMMIT')).toBe('end');
    expect(startsTransactionBlock('/* a /* b */ begin */ SELECT 1')).toBe(false);
  });

  test('a lone text the parser refuses is of kind other when its first word is no transaction word', () => {
    // The server refuses these too (`COMMIT$1` is an identifier to its lexer, not COMMIT): nothing
    // of them runs. As for text without any transaction word, the kind is `other`, not `unknown`.
    expect(['COMMIT$1', 'DO$$ $$', 'UPDATE t SET a = (', 'INSERT INTO t VALUES (1) ON CONFLICT DO'].map(statementKind)).toEqual(
      new Array(4).fill('other'),
    );
    expect(['COMMIT garbage', 'BEGIN garbage', 'CALL'].map(statementKind)).toEqual(['unknown', 'unknown', 'unknown']);
    expect(['COMMIT$1', 'DISCARD'].map(runsUnfenced)).toEqual([false, false]);
    expect(deallocatedStatements('DEALLOCATE$x')).toEqual([]);
    expect(deallocatedStatements('DEALLOCATE (')).toBe('all');
  });
});

describe('parsedStatementKind: a Parse holds one statement to the server', () => {
  test('one statement: its kind; several to the parser: unknown, never the worst of theirs', () => {
    expect(parsedStatementKind('BEGIN ISOLATION LEVEL SERIALIZABLE')).toBe('begin');
    expect(parsedStatementKind('COMMIT;')).toBe('end');
    expect(parsedStatementKind('COMMIT AND CHAIN')).toBe('chain');
    expect(parsedStatementKind("INSERT INTO t VALUES ('begin')")).toBe('other');
    // One INSERT to a server with standard_conforming_strings off; an INSERT and a BEGIN here.
    expect(parsedStatementKind("INSERT INTO t SELECT 'x\\'; BEGIN; -- '")).toBe('unknown');
    expect(parsedStatementKind('SELECT 1; COMMIT')).toBe('unknown');
  });
});
