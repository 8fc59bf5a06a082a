import { describe, expect, it } from 'vitest';
import { TypeStripper } from '../../src/engine/interpreter/typescript.js';

describe('TypeScript type stripping for ts contexts', () => {
  const stripper = new TypeStripper();

  it('removes types and keeps top-level await and the last expression', async () => {
    const out = await stripper.strip('interface P { n: number }\nconst p: P = { n: await Promise.resolve(2) };\np.n as number', 'cell-1');
    expect(out).toEqual({ code: 'const p = { n: await Promise.resolve(2) };\np.n;\n' });
    // The first strip loads the TypeScript compiler: on a starved machine that alone took a minute.
  }, 300_000);

  it('reports type syntax errors with their place, as a SyntaxError', async () => {
    const out = await stripper.strip('const a = 1;\nlet v: = 3', 'cell-7');
    expect(out).toEqual({ error: { name: 'SyntaxError', value: 'Type expected.', traceback: 'cell-7.ts:2:8\nSyntaxError: Type expected. (TS1110)' } });
  });
});
