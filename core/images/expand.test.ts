import { describe, expect, it } from 'vitest';
import { BuildSpecError } from './build-spec.js';
import { canonicalWord, expandWords, quoteWord, wordVariables } from './expand.js';

const vars = { A: 'a', EMPTY: '', HOME: '/root', SP: 'x y' };

describe('expandWords (Docker word processing)', () => {
  it.each([
    // Plain references; undefined → empty.
    ['$A', 'a'],
    ['${A}', 'a'],
    ['pre-${A}-post', 'pre-a-post'],
    ['$A$A', 'aa'],
    ['$NOPE', ''],
    ['${NOPE}', ''],
    ['$Ab', ''], // the name is `Ab`, not `A` followed by b
    ['${A}b', 'ab'],
    ['$', '$'],
    ['a$', 'a$'],
    ['$-x', '$-x'],
    ['$1', ''],
    // Modifiers (Docker's documented set).
    ['${A:-d}', 'a'],
    ['${NOPE:-d}', 'd'],
    ['${EMPTY:-d}', 'd'],
    ['${A-d}', 'a'],
    ['${NOPE-d}', 'd'],
    ['${EMPTY-d}', ''],
    ['${A:+alt}', 'alt'],
    ['${EMPTY:+alt}', ''],
    ['${NOPE:+alt}', ''],
    ['${A+alt}', 'alt'],
    ['${EMPTY+alt}', 'alt'],
    ['${NOPE+alt}', ''],
    ['${NOPE:-$A}', 'a'],
    ['${NOPE:-${A:+nested}}', 'nested'],
    ['${NOPE:-a b}', 'a b'],
    ['${NOPE:-"}"}', '}'],
    // Escapes.
    ['\\$A', '$A'],
    ['\\${A}', '${A}'],
    ['a\\ b', 'a b'],
    ['\\\\', '\\'],
    ['trailing\\', 'trailing'],
    // Quotes: single literal, double expands.
    ["'$A'", '$A'],
    ['"$A"', 'a'],
    ['"a b"', 'a b'],
    ['"$SP"', 'x y'],
    ['"a\\"b"', 'a"b'],
    ['"a\\$A"', 'a$A'],
    ['"a\\xb"', 'a\\xb'], // inside double quotes only " $ \ are escapable
    ["'a\\b'", 'a\\b'],
    ['x"y"\'z\'', 'xyz'],
    ['"${NOPE:-d}"', 'd'],
  ])('%s → %s', (input, expected) => {
    expect(expandWords(input, vars)).toBe(expected);
  });

  it('honours the backtick escape character', () => {
    expect(expandWords('`$A', vars, { escape: '`' })).toBe('$A');
    expect(expandWords('C:\\dir', vars, { escape: '`' })).toBe('C:\\dir');
    expect(expandWords('"`"q"', vars, { escape: '`' })).toBe('"q');
  });

  it.each([
    ["'open", /single-quote/],
    ['"open', /double-quote/],
    ['${A', /matching }/],
    ['${}', /bad substitution/],
    ['${A:x}', /unsupported modifier \(x\)/],
    ['${A#x}', /unsupported modifier \(#\)/],
  ])('refuses %s with a BuildSpecError naming the line', (input, message) => {
    let caught: unknown;
    try {
      expandWords(input, vars, { line: 7 });
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(BuildSpecError);
    expect((caught as BuildSpecError).field).toBe('dockerfile');
    expect((caught as BuildSpecError).line).toBe(7);
    expect((caught as Error).message).toMatch(message);
  });

  it('${VAR:?msg} and ${VAR?msg} fail only when unset (or empty for :?)', () => {
    expect(expandWords('${A:?need A}', vars)).toBe('a');
    expect(expandWords('${EMPTY?need}', vars)).toBe('');
    expect(() => expandWords('${EMPTY:?need it}', vars)).toThrow(/EMPTY: need it/);
    expect(() => expandWords('${NOPE?}', vars)).toThrow(/NOPE: is not allowed to be unset/);
  });

  it('quoteWord gives back the literal through expansion', () => {
    for (const s of ['plain', "it's", 'a "b" c', '$HOME and ${A}', 'back\\slash', '}{']) {
      expect(expandWords(quoteWord(s), vars)).toBe(s);
    }
  });

  it('canonicalWord keeps the meaning of a backtick-escaped word in backslash syntax', () => {
    const words = ['`$A', 'C:\\x\\$A', '"q`"uote" $A', "'lit\\$A'", '${NOPE:-`}x}', 'a` b', '${NOPE:-"}"}'];
    for (const w of words) {
      expect(expandWords(canonicalWord(w, '`'), vars)).toBe(expandWords(w, vars, { escape: '`' }));
    }
    expect(canonicalWord('${A:-x}', '\\')).toBe('${A:-x}');
  });

  it('lists the variables a word refers to', () => {
    expect(wordVariables('$A ${B:-$C} \\$D \'$E\'').sort()).toEqual(['A', 'B', 'C']);
  });
});
