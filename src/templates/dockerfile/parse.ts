import { SandboxError } from '../../errors/index.js';
import { splitRawWords } from './words.js';

/** A command in exec form (a JSON array) or shell form (run with /bin/sh -c). */
export type CommandForm = { form: 'exec'; argv: string[] } | { form: 'shell'; script: string };

interface Base {
  /** 1-based line of the instruction's first physical line. */
  line: number;
  /** The instruction as written, continuations joined (for logs and error messages). */
  text: string;
  /**
   * Build this step anew (and so every step after it): its cache key gets a nonce. Not Dockerfile
   * syntax; set by callers that make instructions themselves (E2B's `skipCache()` on a step).
   */
  force?: boolean;
}

export type Instruction =
  | (Base & { kind: 'FROM'; image: string })
  /** `user`: run this step as that user without changing the user of later steps (E2B's runCmd option). */
  | (Base & { kind: 'RUN'; command: CommandForm; user?: string })
  | (Base & { kind: 'COPY' | 'ADD'; sources: string[]; dest: string; chown?: string; chmod?: string })
  | (Base & { kind: 'ENV'; pairs: [string, string][] })
  | (Base & { kind: 'ARG'; name: string; default?: string })
  | (Base & { kind: 'WORKDIR'; path: string })
  | (Base & { kind: 'USER'; user: string })
  | (Base & { kind: 'CMD' | 'ENTRYPOINT'; command: CommandForm });

/** Instructions Docker has that Capsule refuses, with what to do instead where there is something. */
const REFUSED: Record<string, string> = {
  HEALTHCHECK: 'use the template\'s ready command instead',
  ONBUILD: '',
  STOPSIGNAL: '',
  VOLUME: 'a sandbox\'s /workspace is its volume',
  EXPOSE: 'sandboxes reach ports through the API, not by publishing them',
  LABEL: '',
  MAINTAINER: '',
  SHELL: 'write the shell into RUN (RUN ["bash", "-c", "…"])',
};

export interface ParseOptions {
  /** The file's name in messages: `Dockerfile:12: …`. @default 'Dockerfile' */
  file?: string;
}

/**
 * Parses the Dockerfile subset Capsule builds: FROM (one), RUN, COPY, ADD, ENV, ARG, WORKDIR,
 * USER, CMD and ENTRYPOINT, with `\` continuations and `#` comments. Anything else is
 * INVALID_ARGUMENT naming the file and line: `Dockerfile:7: instruction HEALTHCHECK is not supported`.
 */
export function parseDockerfile(source: string, options: ParseOptions = {}): Instruction[] {
  const file = options.file ?? 'Dockerfile';
  const fail = (line: number, message: string, hint?: string): never => {
    throw new SandboxError('INVALID_ARGUMENT', `${file}:${line}: ${message}`, { details: { file, line }, ...(hint ? { hint } : {}) });
  };
  const instructions: Instruction[] = [];
  const lines = source.replace(/^\uFEFF/, '').split(/\r?\n/);
  let directivesOpen = true;
  let logical = '';
  let start = 0;
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!;
    if (logical === '' && directivesOpen) {
      const directive = /^#\s*([a-zA-Z]+)\s*=\s*(.*?)\s*$/.exec(raw);
      if (directive) {
        if (directive[1]!.toLowerCase() === 'escape' && directive[2] !== '\\') fail(i + 1, `the escape directive "${directive[2]}" is not supported (only \\)`);
        continue;
      }
      directivesOpen = false;
    }
    if (/^\s*#/.test(raw)) continue;
    if (logical === '' && raw.trim() === '') continue;
    if (logical === '') start = i + 1;
    const continued = /\\[ \t]*$/.exec(raw);
    if (continued) {
      logical += raw.slice(0, continued.index);
      continue;
    }
    logical += raw;
    if (logical.trim() !== '') instructions.push(parseInstruction(logical.trim(), start, fail));
    logical = '';
  }
  if (logical.trim() !== '') instructions.push(parseInstruction(logical.trim(), start, fail));
  const froms = instructions.filter((i) => i.kind === 'FROM');
  if (froms.length === 0) fail(instructions[0]?.line ?? 1, 'a Dockerfile starts with FROM (a template, an image or scratch)');
  if (froms.length > 1) fail(froms[1]!.line, 'multi-stage builds are not supported: use one FROM');
  const firstOther = instructions.findIndex((i) => i.kind !== 'ARG');
  if (instructions[firstOther]?.kind !== 'FROM') fail(instructions[firstOther]!.line, 'only ARG may come before FROM');
  return instructions;
}

type Fail = (line: number, message: string, hint?: string) => never;

function parseInstruction(text: string, line: number, fail: Fail): Instruction {
  const match = /^(\S+)\s*(.*)$/s.exec(text)!;
  const keyword = match[1]!.toUpperCase();
  const rest = match[2]!.trim();
  const base = { line, text };
  if (keyword in REFUSED) fail(line, `instruction ${keyword} is not supported`, REFUSED[keyword] || undefined);
  const needArgs = () => {
    if (rest === '') fail(line, `${keyword} needs arguments`);
  };
  switch (keyword) {
    case 'FROM': {
      needArgs();
      const words = splitRawWords(rest);
      if (words[0]?.startsWith('--')) fail(line, `FROM ${words[0].split('=')[0]} is not supported`);
      if (words.length === 3 && words[1]!.toUpperCase() === 'AS') return { ...base, kind: 'FROM', image: words[0]! };
      if (words.length !== 1) fail(line, 'FROM takes one image or template (FROM name[:tag] [AS stage])');
      return { ...base, kind: 'FROM', image: words[0]! };
    }
    case 'RUN': {
      needArgs();
      if (/^--[a-z]/.test(rest)) fail(line, `RUN ${rest.split(/[\s=]/)[0]} is not supported`, 'a build step\'s network is the build\'s network grant');
      return { ...base, kind: 'RUN', command: commandForm(rest) };
    }
    case 'CMD':
    case 'ENTRYPOINT':
      needArgs();
      return { ...base, kind: keyword, command: commandForm(rest) };
    case 'COPY':
    case 'ADD':
      needArgs();
      return { ...base, ...copyArgs(keyword, rest, line, fail) };
    case 'ENV':
      needArgs();
      return { ...base, kind: 'ENV', pairs: envPairs(rest, line, fail) };
    case 'ARG': {
      needArgs();
      const words = splitRawWords(rest);
      if (words.length !== 1) fail(line, 'ARG declares one name (ARG NAME[=default])');
      const [name = '', ...value] = words[0]!.split('=');
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) fail(line, `"${name}" is not a valid ARG name`);
      return value.length > 0 ? { ...base, kind: 'ARG', name, default: value.join('=') } : { ...base, kind: 'ARG', name };
    }
    case 'WORKDIR':
      needArgs();
      return { ...base, kind: 'WORKDIR', path: rest };
    case 'USER':
      needArgs();
      return { ...base, kind: 'USER', user: rest };
    default:
      return fail(line, `instruction ${keyword} is not supported`, 'Capsule builds FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD and ENTRYPOINT.');
  }
}

/** Exec form when the text is a JSON array of strings (Docker's rule); shell form otherwise. */
function commandForm(rest: string): CommandForm {
  const argv = jsonArray(rest);
  return argv ? { form: 'exec', argv } : { form: 'shell', script: rest };
}

function jsonArray(text: string): string[] | undefined {
  if (!text.startsWith('[')) return undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    return Array.isArray(parsed) && parsed.every((v) => typeof v === 'string') ? parsed : undefined;
  } catch {
    return undefined;
  }
}

function copyArgs(kind: 'COPY' | 'ADD', rest: string, line: number, fail: Fail): { kind: 'COPY' | 'ADD'; sources: string[]; dest: string; chown?: string; chmod?: string } {
  let text = rest;
  let chown: string | undefined;
  let chmod: string | undefined;
  for (let flag = /^(--[a-z-]+)(?:=(\S*))?\s*/.exec(text); flag; flag = /^(--[a-z-]+)(?:=(\S*))?\s*/.exec(text)) {
    text = text.slice(flag[0].length);
    const [, name, value] = flag;
    if (name === '--chown' && value) chown = value;
    else if (name === '--chmod' && value) {
      if (!/^[0-7]{3,4}$/.test(value)) fail(line, `${kind} --chmod wants octal permissions like 0755, not "${value}"`);
      chmod = value;
    } else fail(line, `${kind} ${name} is not supported`, name === '--from' ? 'multi-stage builds are not supported' : undefined);
  }
  // Exec form: each string is quoted again so that expansion later sees it as one word.
  const json = jsonArray(text);
  const words = json ? json.map((w) => `"${w.replace(/[\\"]/g, (c) => `\\${c}`)}"`) : splitRawWords(text);
  if (words.length < 2) fail(line, `${kind} needs a source and a destination`);
  const sources = words.slice(0, -1);
  if (kind === 'ADD') {
    const url = sources.find((s) => /^"?[a-z][a-z0-9+.-]*:\/\//i.test(s) || /^"?git@/.test(s));
    if (url) fail(line, `ADD of a URL (${url}) is not supported: ADD copies local files only`, 'Download it in a RUN step (RUN curl …), which uses the build\'s network grant.');
  }
  return { kind, sources, dest: words.at(-1)!, ...(chown ? { chown } : {}), ...(chmod ? { chmod } : {}) };
}

function envPairs(rest: string, line: number, fail: Fail): [string, string][] {
  const words = splitRawWords(rest);
  if (!words[0]!.includes('=')) {
    // Legacy form: ENV key value with spaces.
    const key = words[0]!;
    const value = rest.slice(rest.indexOf(key) + key.length).trim();
    if (value === '') fail(line, `ENV ${key} needs a value (ENV ${key}=value)`);
    return [[checkEnvName(key, line, fail), value]];
  }
  return words.map((word) => {
    const eq = word.indexOf('=');
    if (eq <= 0) fail(line, `ENV expects name=value pairs, not "${word}"`);
    return [checkEnvName(word.slice(0, eq), line, fail), word.slice(eq + 1)];
  });
}

function checkEnvName(name: string, line: number, fail: Fail): string {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) fail(line, `"${name}" is not a valid environment variable name`);
  return name;
}
