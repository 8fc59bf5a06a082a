import { describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { parseDockerfile, type Instruction } from '../../src/templates/dockerfile/parse.js';
import { processWord, processWords, splitRawWords } from '../../src/templates/dockerfile/words.js';

function parseError(text: string, file?: string): { code: string; message: string; line: unknown; hint?: string } {
  try {
    parseDockerfile(text, file ? { file } : {});
  } catch (error) {
    if (!isSandboxError(error)) throw error;
    return { code: error.code, message: error.message, line: error.details?.line, hint: error.hint };
  }
  throw new Error('expected a parse error');
}

const strip = (list: Instruction[]) => list.map(({ text: _text, ...rest }) => rest);

describe('Dockerfile parser', () => {
  it('parses every supported instruction with its line', () => {
    const text = [
      '# syntax=docker/dockerfile:1',
      'ARG BASE=base',
      'FROM ${BASE} AS build',
      'RUN apt-get update',
      'RUN ["echo", "exec form"]',
      'COPY --chown=user:user --chmod=0644 a.txt b/ /app/',
      'ADD c.txt /app/c.txt',
      'ENV A=1 B="two words" C',
      'ENV LEGACY value with spaces',
      'ARG VERSION',
      'WORKDIR /app',
      'USER user',
      'CMD python3 -m http.server',
      'ENTRYPOINT ["/bin/tini", "--"]',
    ].join('\n');
    const parsed = parseDockerfile(text.replace('ENV A=1 B="two words" C', 'ENV A=1 B="two words" C=3'));
    expect(strip(parsed)).toEqual([
      { kind: 'ARG', line: 2, name: 'BASE', default: 'base' },
      { kind: 'FROM', line: 3, image: '${BASE}' },
      { kind: 'RUN', line: 4, command: { form: 'shell', script: 'apt-get update' } },
      { kind: 'RUN', line: 5, command: { form: 'exec', argv: ['echo', 'exec form'] } },
      { kind: 'COPY', line: 6, sources: ['a.txt', 'b/'], dest: '/app/', chown: 'user:user', chmod: '0644' },
      { kind: 'ADD', line: 7, sources: ['c.txt'], dest: '/app/c.txt' },
      { kind: 'ENV', line: 8, pairs: [['A', '1'], ['B', '"two words"'], ['C', '3']] },
      { kind: 'ENV', line: 9, pairs: [['LEGACY', 'value with spaces']] },
      { kind: 'ARG', line: 10, name: 'VERSION' },
      { kind: 'WORKDIR', line: 11, path: '/app' },
      { kind: 'USER', line: 12, user: 'user' },
      { kind: 'CMD', line: 13, command: { form: 'shell', script: 'python3 -m http.server' } },
      { kind: 'ENTRYPOINT', line: 14, command: { form: 'exec', argv: ['/bin/tini', '--'] } },
    ]);
  });

  it('joins continuations, drops comments inside them, and numbers by the first line', () => {
    const parsed = parseDockerfile(['FROM base', '', '# a comment', 'RUN apt-get update && \\', '    # not part of the command', '    apt-get install -y \\  ', '      figlet', 'USER user'].join('\n'));
    expect(strip(parsed)).toEqual([
      { kind: 'FROM', line: 1, image: 'base' },
      { kind: 'RUN', line: 4, command: { form: 'shell', script: 'apt-get update &&     apt-get install -y       figlet' } },
      { kind: 'USER', line: 8, user: 'user' },
    ]);
  });

  it('reads keywords in any case, CRLF line ends and a BOM', () => {
    const parsed = parseDockerfile('\uFEFFfrom base\r\nrun echo hi\r\nworkdir /x\r\n');
    expect(parsed.map((i) => i.kind)).toEqual(['FROM', 'RUN', 'WORKDIR']);
  });

  it('treats a RUN that is not a JSON array of strings as shell form', () => {
    const [, run] = parseDockerfile('FROM base\nRUN [ -f /etc/passwd ] && echo yes');
    expect(run).toMatchObject({ kind: 'RUN', command: { form: 'shell', script: '[ -f /etc/passwd ] && echo yes' } });
  });

  it('keeps COPY exec-form sources as single words, spaces and quotes included', () => {
    const [, copy] = parseDockerfile('FROM base\nCOPY ["my file.txt", "say \\"hi\\".txt", "/dest dir/"]');
    expect(copy).toMatchObject({ kind: 'COPY', dest: '"/dest dir/"' });
    if (copy?.kind !== 'COPY') throw new Error('expected COPY');
    const sources = copy.sources.map((s) => processWord(s, () => undefined));
    expect(sources).toEqual(['my file.txt', 'say "hi".txt']);
  });

  it('refuses every other instruction with file, line and the instruction', () => {
    for (const keyword of ['HEALTHCHECK CMD true', 'EXPOSE 80', 'VOLUME /data', 'LABEL a=b', 'SHELL ["bash", "-c"]', 'ONBUILD RUN x', 'STOPSIGNAL SIGTERM', 'MAINTAINER me', 'FOO bar']) {
      const name = keyword.split(' ')[0]!;
      const error = parseError(`FROM base\nRUN true\n${keyword}`, 'app.Dockerfile');
      expect(error.code).toBe('INVALID_ARGUMENT');
      expect(error.message).toBe(`app.Dockerfile:3: instruction ${name} is not supported`);
      expect(error.line).toBe(3);
    }
  });

  it('refuses what the subset does not build, each with its line', () => {
    expect(parseError('FROM a\nFROM b').message).toBe('Dockerfile:2: multi-stage builds are not supported: use one FROM');
    expect(parseError('RUN true\nFROM base').message).toBe('Dockerfile:1: only ARG may come before FROM');
    expect(parseError('RUN true').message).toMatch(/^Dockerfile:1: a Dockerfile starts with FROM/);
    expect(parseError('# just a comment\n').message).toMatch(/^Dockerfile:1: a Dockerfile starts with FROM/);
    expect(parseError('FROM --platform=linux/arm64 base').message).toBe('Dockerfile:1: FROM --platform is not supported');
    expect(parseError('FROM base\nCOPY --from=build /a /b').message).toBe('Dockerfile:2: COPY --from is not supported');
    expect(parseError('FROM base\nRUN --mount=type=cache,target=/x true').message).toBe('Dockerfile:2: RUN --mount is not supported');
    expect(parseError('FROM base\nCOPY --chmod=u+x a /a').message).toMatch(/^Dockerfile:2: COPY --chmod wants octal/);
    expect(parseError('FROM base\nCOPY onlyone').message).toBe('Dockerfile:2: COPY needs a source and a destination');
    expect(parseError('FROM base\nENV 1BAD=x').message).toBe('Dockerfile:2: "1BAD" is not a valid environment variable name');
    expect(parseError('# escape=`\nFROM base').message).toMatch(/^Dockerfile:1: the escape directive/);
    expect(parseError('FROM base\nWORKDIR').message).toBe('Dockerfile:2: WORKDIR needs arguments');
  });

  it('refuses ADD of a URL, pointing at RUN curl', () => {
    const error = parseError('FROM base\n\nADD https://example.com/x.tgz /opt/');
    expect(error.message).toBe('Dockerfile:3: ADD of a URL (https://example.com/x.tgz) is not supported: ADD copies local files only');
    expect(error.hint).toMatch(/RUN curl/);
    expect(parseError('FROM base\nADD git@github.com:a/b.git /src').code).toBe('INVALID_ARGUMENT');
  });
});

describe('Dockerfile words and variables', () => {
  const vars: Record<string, string> = { NAME: 'capsule', EMPTY: '', DIR: '/opt/app' };
  const lookup = (name: string) => vars[name];

  it('expands $VAR, ${VAR} and the :- :+ - + forms, but not inside single quotes', () => {
    expect(processWord('$NAME-${NAME}', lookup)).toBe('capsule-capsule');
    expect(processWord('${MISSING:-fallback} ${EMPTY:-empty} ${EMPTY-set}', lookup)).toBe('fallback empty ');
    expect(processWord('${NAME:+yes}${MISSING:+no}${EMPTY+defined}', lookup)).toBe('yesdefined');
    expect(processWord("'$NAME'", lookup)).toBe('$NAME');
    expect(processWord('"$NAME and \\$NAME"', lookup)).toBe('capsule and $NAME');
    expect(processWord('\\$NAME', lookup)).toBe('$NAME');
    expect(processWord('${DIR}/bin', lookup)).toBe('/opt/app/bin');
    expect(processWord('${MISSING:-$DIR}', lookup)).toBe('/opt/app');
  });

  it('keeps a backslash that escapes nothing inside double quotes', () => {
    expect(processWord('"a\\nb"', lookup)).toBe('a\\nb');
    expect(processWord('a\\ b', lookup)).toBe('a b');
  });

  it('splits at unquoted whitespace only', () => {
    expect(splitRawWords(`a "b c" 'd e' f\\ g`)).toEqual(['a', '"b c"', "'d e'", 'f\\ g']);
    expect(processWords(`"$NAME x" y`, lookup)).toEqual(['capsule x', 'y']);
  });
});
