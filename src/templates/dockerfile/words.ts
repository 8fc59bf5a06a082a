/**
 * Docker's word processing for the instructions it expands (FROM, COPY, ADD, ENV, ARG, WORKDIR,
 * USER): quotes removed, `\` escapes, and `$name`, `${name}`, `${name:-word}`, `${name:+word}`,
 * `${name-word}`, `${name+word}` expanded from the build's variables, except inside single
 * quotes. RUN, CMD and ENTRYPOINT are not expanded here: their shell does it.
 */
export type Lookup = (name: string) => string | undefined;

const NAME_START = /[A-Za-z_]/;
const NAME_CHAR = /[A-Za-z0-9_]/;

/** Splits `text` into words at unquoted whitespace, quotes kept (for `key=value` splitting). */
export function splitRawWords(text: string): string[] {
  const words: string[] = [];
  let word = '';
  let quote: '"' | "'" | undefined;
  let inWord = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote === undefined && /\s/.test(c)) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
      continue;
    }
    inWord = true;
    word += c;
    if (c === '\\' && quote !== "'" && i + 1 < text.length) {
      word += text[++i];
      continue;
    }
    if (quote === undefined && (c === '"' || c === "'")) quote = c;
    else if (c === quote) quote = undefined;
  }
  if (inWord) words.push(word);
  return words;
}

/** One word: quotes removed, escapes applied, variables expanded. */
export function processWord(text: string, lookup: Lookup): string {
  let out = '';
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote === "'") {
      if (c === "'") quote = undefined;
      else out += c;
      continue;
    }
    if (c === '\\' && i + 1 < text.length) {
      const next = text[i + 1]!;
      // Inside double quotes a backslash escapes only what the shell would let it.
      if (quote === '"' && !['"', '\\', '$'].includes(next)) {
        out += c;
        continue;
      }
      out += next;
      i++;
      continue;
    }
    if (c === '"') {
      quote = quote === '"' ? undefined : '"';
      continue;
    }
    if (c === "'" && quote === undefined) {
      quote = "'";
      continue;
    }
    if (c === '$') {
      const expanded = expandAt(text, i, lookup);
      if (expanded) {
        out += expanded.value;
        i = expanded.end - 1;
        continue;
      }
    }
    out += c;
  }
  return out;
}

/** Words of `text` (split, then each processed). */
export function processWords(text: string, lookup: Lookup): string[] {
  return splitRawWords(text).map((word) => processWord(word, lookup));
}

function expandAt(text: string, at: number, lookup: Lookup): { value: string; end: number } | undefined {
  const next = text[at + 1];
  if (next === undefined) return undefined;
  if (NAME_START.test(next)) {
    let end = at + 1;
    while (end < text.length && NAME_CHAR.test(text[end]!)) end++;
    return { value: lookup(text.slice(at + 1, end)) ?? '', end };
  }
  if (next !== '{') return undefined;
  const close = matchingBrace(text, at + 1);
  if (close < 0) return undefined;
  const body = text.slice(at + 2, close);
  const match = /^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])(.*))?$/s.exec(body);
  if (!match) return { value: '', end: close + 1 };
  const [, name, op, word = ''] = match;
  const value = lookup(name!);
  const set = op?.startsWith(':') ? value !== undefined && value !== '' : value !== undefined;
  if (op?.endsWith('-')) return { value: set ? value! : processWord(word, lookup), end: close + 1 };
  if (op?.endsWith('+')) return { value: set ? processWord(word, lookup) : '', end: close + 1 };
  return { value: value ?? '', end: close + 1 };
}

function matchingBrace(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === '\\') i++;
    else if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return i;
  }
  return -1;
}
