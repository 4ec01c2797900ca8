// Docker's word processing for Dockerfile values (FROM, COPY/ADD, ENV, ARG, WORKDIR, USER,
// LABEL, EXPOSE, VOLUME, STOPSIGNAL): quotes, the escape character and `$VAR` substitution,
// done in one pass as BuildKit's shell lexer does, so `'$x'` stays literal and `"a b"` loses its
// quotes. RUN, CMD, ENTRYPOINT and SHELL are not words: their shell (or argv) is left alone.
//
// dockerfile-ast resolves variables for editor hints only (no modifiers, no quote rules), so the
// lexer is here: a word is parsed into parts once, then either expanded (`expandWords`) or
// rendered back in backslash-escape syntax (`canonicalWord`, which lets the parser hand the
// engine words of a `# escape=\`` Dockerfile that need no escape directive any more).
import { BuildSpecError } from './build-spec.js';

/** A literal run of characters, or a `$name` / `${name…}` reference. */
export type WordPart =
  | { text: string }
  | { name: string; modifier?: SubstitutionModifier; word?: WordPart[] };

/** `${v:-w}` `${v-w}` `${v:+w}` `${v+w}` `${v:?w}` `${v?w}`. */
export type SubstitutionModifier = ':-' | '-' | ':+' | '+' | ':?' | '?';

/** A word Docker's lexer refuses (unterminated quote, bad substitution). */
export class WordSyntaxError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WordSyntaxError';
  }
}

class Scanner {
  pos = 0;
  constructor(
    readonly text: string,
    readonly escape: string,
  ) {}
  peek(): string | undefined {
    return this.pos < this.text.length ? this.text[this.pos] : undefined;
  }
  next(): string | undefined {
    return this.pos < this.text.length ? this.text[this.pos++] : undefined;
  }
}

function pushText(parts: WordPart[], text: string): void {
  if (text === '') return;
  const last = parts[parts.length - 1];
  if (last && 'text' in last) last.text += text;
  else parts.push({ text });
}

/** Unquoted context, up to `stop` (the `}` of a substitution's word) or the end. */
function parseUnquoted(s: Scanner, stop: string | undefined): WordPart[] {
  const parts: WordPart[] = [];
  for (;;) {
    const ch = s.peek();
    if (ch === undefined) {
      if (stop !== undefined) throw new WordSyntaxError(`unexpected end of word while looking for matching ${stop}`);
      return parts;
    }
    if (stop !== undefined && ch === stop) {
      s.next();
      return parts;
    }
    if (ch === "'") {
      s.next();
      let text = '';
      for (;;) {
        const c = s.next();
        if (c === undefined) throw new WordSyntaxError('unexpected end of word while looking for matching single-quote');
        if (c === "'") break;
        text += c;
      }
      pushText(parts, text);
      continue;
    }
    if (ch === '"') {
      s.next();
      parseDoubleQuoted(s, parts);
      continue;
    }
    if (ch === '$') {
      parseDollar(s, parts);
      continue;
    }
    s.next();
    if (ch === s.escape) {
      // A trailing escape is dropped; otherwise the next character is taken literally.
      const escaped = s.next();
      if (escaped !== undefined) pushText(parts, escaped);
      continue;
    }
    pushText(parts, ch);
  }
}

function parseDoubleQuoted(s: Scanner, parts: WordPart[]): void {
  for (;;) {
    const ch = s.peek();
    if (ch === undefined) throw new WordSyntaxError('unexpected end of word while looking for matching double-quote');
    if (ch === '"') {
      s.next();
      return;
    }
    if (ch === '$') {
      parseDollar(s, parts);
      continue;
    }
    s.next();
    if (ch === s.escape) {
      // Inside double quotes only `"`, `$` and the escape itself can be escaped; any other
      // escape character is kept as written.
      const n = s.peek();
      if (n === '"' || n === '$' || n === s.escape) {
        s.next();
        pushText(parts, n);
        continue;
      }
    }
    pushText(parts, ch);
  }
}

function isNameChar(c: string | undefined): boolean {
  return c !== undefined && /[A-Za-z0-9_]/.test(c);
}

function parseName(s: Scanner): string {
  let name = '';
  const first = s.peek();
  if (first !== undefined && /[0-9]/.test(first)) {
    // Positional parameters ($1): digits only, as the shell lexer reads them.
    while (s.peek() !== undefined && /[0-9]/.test(s.peek()!)) name += s.next();
    return name;
  }
  while (isNameChar(s.peek())) name += s.next();
  return name;
}

function parseDollar(s: Scanner, parts: WordPart[]): void {
  s.next(); // $
  if (s.peek() !== '{') {
    const name = parseName(s);
    if (name === '') pushText(parts, '$');
    else parts.push({ name });
    return;
  }
  s.next(); // {
  const name = parseName(s);
  if (name === '') throw new WordSyntaxError('bad substitution: ${} without a variable name');
  const ch = s.next();
  if (ch === '}') {
    parts.push({ name });
    return;
  }
  let modifier: SubstitutionModifier;
  if (ch === ':') {
    const m = s.next();
    if (m !== '-' && m !== '+' && m !== '?') {
      throw new WordSyntaxError(`unsupported modifier (${m ?? 'end of word'}) in substitution of ${name}`);
    }
    modifier = `:${m}`;
  } else if (ch === '-' || ch === '+' || ch === '?') {
    modifier = ch;
  } else if (ch === undefined) {
    throw new WordSyntaxError('unexpected end of word while looking for matching }');
  } else {
    throw new WordSyntaxError(`unsupported modifier (${ch}) in substitution of ${name}`);
  }
  const word = parseUnquoted(s, '}');
  parts.push({ name, modifier, word });
}

/** Parses a word (Docker's lexer rules, `escape` being `\` or `` ` ``). */
export function parseWord(text: string, escape = '\\'): WordPart[] {
  return parseUnquoted(new Scanner(text, escape), undefined);
}

function evaluate(parts: WordPart[], vars: Record<string, string>): string {
  let out = '';
  for (const part of parts) {
    if ('text' in part) {
      out += part.text;
      continue;
    }
    const set = Object.prototype.hasOwnProperty.call(vars, part.name);
    const value = set ? vars[part.name]! : '';
    const word = () => evaluate(part.word ?? [], vars);
    switch (part.modifier) {
      case undefined:
        out += value;
        break;
      case ':-':
        out += value !== '' ? value : word();
        break;
      case '-':
        out += set ? value : word();
        break;
      case ':+':
        out += value !== '' ? word() : '';
        break;
      case '+':
        out += set ? word() : '';
        break;
      case ':?':
      case '?': {
        if (part.modifier === '?' ? !set : value === '') {
          const message = word();
          throw new WordSyntaxError(`${part.name}: ${message || (part.modifier === '?' ? 'is not allowed to be unset' : 'is not allowed to be empty')}`);
        }
        out += value;
        break;
      }
    }
  }
  return out;
}

export interface ExpandOptions {
  /** The Dockerfile's escape character (default `\`). Words from `parseDockerfile` always use `\`. */
  escape?: string;
  /** Named by the BuildSpecError a bad word throws (default `dockerfile`). */
  field?: string;
  /** The step's line (`step.at.line`), for the error. */
  line?: number;
}

/**
 * Docker's word expansion: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
 * `${VAR:+alt}`, `${VAR+alt}`, `${VAR:?message}`, `${VAR?message}`; single quotes literal,
 * double quotes expand; the escape character makes the next character literal (`\$HOME`).
 * An undefined variable expands to the empty string. Throws a BuildSpecError on a word
 * Docker would refuse (unterminated quote, `${}`, an unsupported modifier, `:?` on an unset
 * variable).
 */
export function expandWords(text: string, vars: Record<string, string>, options: ExpandOptions = {}): string {
  try {
    return evaluate(parseWord(text, options.escape ?? '\\'), vars);
  } catch (err) {
    if (err instanceof WordSyntaxError) throw new BuildSpecError(options.field ?? 'dockerfile', options.line, err.message);
    throw err;
  }
}

/** The names a word refers to (for a cache key, or to tell which ARGs an instruction uses). */
export function wordVariables(text: string, escape = '\\'): string[] {
  const names = new Set<string>();
  const walk = (parts: WordPart[]) => {
    for (const p of parts) {
      if ('name' in p) {
        names.add(p.name);
        if (p.word) walk(p.word);
      }
    }
  };
  walk(parseWord(text, escape));
  return [...names];
}

/** Renders a literal so that `expandWords` gives it back unchanged (backslash escapes). */
export function quoteWord(literal: string): string {
  return literal.replace(/[\\$'"]/g, (c) => `\\${c}`);
}

/**
 * A JSON value as a word: literal, except `$VAR` / `${VAR…}` references (and `\\$` for a literal
 * `$`). For front doors whose values are not Dockerfile text (native JSON steps, SDK builders):
 * quotes and backslashes mean themselves, variables still expand as in a Dockerfile.
 */
export function jsonWord(value: string): string {
  return value.replace(/\\(\$)|([\\'"])/g, (_m, dollar: string | undefined, c: string | undefined) => (dollar ? '\\$' : `\\${c}`));
}

function render(parts: WordPart[], inSubstitution: boolean): string {
  let out = '';
  for (const p of parts) {
    if ('text' in p) {
      const quoted = quoteWord(p.text);
      // Inside `${v:-…}` a literal `}` would end the word early: escape it too.
      out += inSubstitution ? quoted.replace(/}/g, '\\}') : quoted;
    } else if (p.modifier === undefined) out += `\${${p.name}}`;
    else out += `\${${p.name}${p.modifier}${render(p.word ?? [], true)}}`;
  }
  return out;
}

/**
 * The same word in backslash-escape syntax (what `expandWords` reads by default). Identity in
 * meaning: `expandWords(canonicalWord(w, e), v) === expandWords(w, v, {escape: e})`.
 */
export function canonicalWord(text: string, escape: string): string {
  return render(parseWord(text, escape), false);
}
