import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from '@e2b/code-interpreter';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';

/** The official `@e2b/code-interpreter` 2.8.0 SDK (pinned) against Capsule's interpreter contexts. */
let server: E2bTestServer;

beforeAll(async () => {
  server = await startE2bServer();
});
afterAll(async () => {
  await server?.server.close();
});
afterEach(expectNoLeaks);

describe('@e2b/code-interpreter 2.8 against Capsule', () => {
  it('keeps state across runCode calls, streams output, reports errors, draws a PNG chart', async () => {
    const sbx = await Sandbox.create({ ...server.opts, timeoutMs: 120_000 });
    try {
      expect((await sbx.runCode('x = 1')).error).toBeUndefined();
      const two = await sbx.runCode('x + 1');
      expect(two.text).toBe('2');
      const out: string[] = [];
      const printed = await sbx.runCode('print("hello"); import sys; print("oops", file=sys.stderr)', { onStdout: (m) => void out.push(m.line) });
      expect(printed.logs).toEqual({ stdout: ['hello\n'], stderr: ['oops\n'] });
      expect(out.join('')).toBe('hello\n');
      const failed = await sbx.runCode('1 / 0');
      expect(failed.error).toMatchObject({ name: 'ZeroDivisionError' });
      const chart = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()');
      const png = chart.results.find((r) => r.png);
      expect(Buffer.from(png?.png ?? '', 'base64').subarray(1, 4).toString()).toBe('PNG');
    } finally {
      await sbx.kill();
    }
  });

  it('creates, lists, restarts and removes contexts; a context keeps its own state', async () => {
    const sbx = await Sandbox.create({ ...server.opts, timeoutMs: 120_000 });
    try {
      const js = await sbx.createCodeContext({ language: 'js' });
      expect(js).toMatchObject({ language: 'javascript', cwd: '/home/user' });
      await sbx.runCode('let n = 41', { context: js });
      expect((await sbx.runCode('n + 1', { context: js })).text).toBe('42');
      expect((await sbx.listCodeContexts()).map((c) => c.id)).toContain(js.id);
      await sbx.restartCodeContext(js);
      expect((await sbx.runCode('typeof n', { context: js })).text).toBe("'undefined'");
      await sbx.removeCodeContext(js);
      expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(js.id);
      await expect(sbx.runCode('1', { context: js })).rejects.toThrow(/Context .* not found/);
    } finally {
      await sbx.kill();
    }
  });
});
