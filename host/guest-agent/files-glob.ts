// Glob patterns, compiled to regular expressions. Written here rather than taken from a library
// because the agent bundle should stay small and the dialect is tiny:
//   *        any run of characters except "/"
//   ?        one character except "/"
//   **       any run of characters including "/"; "**/" also matches no directory at all
//   [abc] [a-z] [!a-z] [^a-z]   a character class (never matches "/")
//   {a,b}    alternatives, which may nest and contain any of the above
//   \x       the character x literally
// A pattern without "/" is matched against an entry's name, one with "/" against its path
// relative to the directory searched (so `src/**/*.ts` works the way people expect).
import { validationFailed } from './errors.js';

export interface GlobMatcher {
  /** True when the pattern is matched against relative paths rather than names. */
  matchesPath: boolean;
  test(name: string, relativePath: string): boolean;
}

const REGEX_SPECIALS = /[.*+?^${}()|[\]\\/]/g;

function escapeRegExp(text: string): string {
  return text.replace(REGEX_SPECIALS, '\\$&');
}

/** Index of the `]` closing a class opened at `start`, or -1 when the class is unterminated. */
function classEnd(pattern: string, start: number): number {
  let index = start + 1;
  if (pattern[index] === '!' || pattern[index] === '^') index++;
  // A "]" right after the opening (or the negation) is a literal member, as in POSIX.
  if (pattern[index] === ']') index++;
  for (; index < pattern.length; index++) {
    if (pattern[index] === '\\') index++;
    else if (pattern[index] === ']') return index;
  }
  return -1;
}

function translateClass(body: string): string {
  let negated = false;
  let rest = body;
  if (rest.startsWith('!') || rest.startsWith('^')) {
    negated = true;
    rest = rest.slice(1);
  }
  // Inside a regex class only \, ] and ^ (and - at the edges, kept as ranges) are special.
  const members = rest.replace(/\\(.)/g, '$1').replace(/[\\\]^]/g, '\\$&');
  return negated ? `[^/${members}]` : `(?!/)[${members}]`;
}

/** Whether every `{` has its `}`; unbalanced braces are taken literally. */
function bracesBalanced(pattern: string): boolean {
  let depth = 0;
  for (let index = 0; index < pattern.length; index++) {
    const char = pattern[index];
    if (char === '\\') index++;
    else if (char === '{') depth++;
    else if (char === '}' && --depth < 0) return false;
  }
  return depth === 0;
}

export function globToRegExp(pattern: string): RegExp {
  const useBraces = bracesBalanced(pattern);
  let source = '';
  let braceDepth = 0;
  for (let index = 0; index < pattern.length; index++) {
    const char = pattern[index];
    if (char === '\\' && index + 1 < pattern.length) {
      source += escapeRegExp(pattern[++index]);
    } else if (char === '*') {
      if (pattern[index + 1] === '*') {
        index++;
        // "**/" is "zero or more whole directories"; a bare "**" is "anything at all".
        if (pattern[index + 1] === '/') {
          index++;
          source += '(?:.*/)?';
        } else {
          source += '.*';
        }
      } else {
        source += '[^/]*';
      }
    } else if (char === '?') {
      source += '[^/]';
    } else if (char === '[') {
      const end = classEnd(pattern, index);
      if (end === -1) {
        source += '\\[';
      } else {
        source += translateClass(pattern.slice(index + 1, end));
        index = end;
      }
    } else if (useBraces && char === '{') {
      braceDepth++;
      source += '(?:';
    } else if (useBraces && char === '}' && braceDepth > 0) {
      braceDepth--;
      source += ')';
    } else if (useBraces && char === ',' && braceDepth > 0) {
      source += '|';
    } else {
      source += escapeRegExp(char);
    }
  }
  // `s`: a name may contain a newline, and "**" must still match across it.
  return new RegExp(`^${source}$`, 's');
}

export function compileGlob(pattern: string | null, field: string): GlobMatcher {
  if (pattern === null || pattern === '') throw validationFailed(field, 'required');
  if (pattern.includes('\0')) throw validationFailed(field, 'must not contain a NUL byte');
  if (!pattern.includes('/')) {
    const regex = globToRegExp(pattern);
    return { matchesPath: false, test: (name) => regex.test(name) };
  }
  // Relative to the searched directory: a leading "./" or "/" adds nothing.
  const relative = pattern.replace(/^(?:\.\/|\/)+/, '');
  const regex = globToRegExp(relative);
  return { matchesPath: true, test: (_name, relativePath) => regex.test(relativePath) };
}
