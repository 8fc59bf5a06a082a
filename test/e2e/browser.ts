import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { defaultUiDir } from '../../src/server/console/static-ui.js';

export const CHROMIUM = '/usr/bin/chromium';

/** Debian's chromium, headless, with nothing that reaches beyond loopback. */
const FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export interface TestBrowser {
  context: BrowserContext;
  page: Page;
  /** Errors a page threw and did not catch: a test asserts there are none. */
  pageErrors: string[];
  /** Every URL a page of this browser requested (a test asserts all went to its server). */
  requests: string[];
  close(): Promise<void>;
}

/** Why the browser tests cannot run here, or undefined: they fail loudly, never skip. */
export function browserProblem(): string | undefined {
  if (!existsSync(CHROMIUM)) return `${CHROMIUM} is missing: apt-get install chromium (scripts/setup.sh does)`;
  if (!existsSync(join(defaultUiDir(), 'index.html'))) return `the console is not built (${defaultUiDir()}): run npm run build`;
  return undefined;
}

/** A browser with a new, empty user-data-dir, removed again on close. */
export async function openBrowser(): Promise<TestBrowser> {
  const problem = browserProblem();
  if (problem) throw new Error(problem);
  const userDataDir = mkdtempSync(join(tmpdir(), 'capsule-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    viewport: { width: 1400, height: 900 },
    acceptDownloads: true,
    timeout: 60_000,
  });
  context.setDefaultTimeout(30_000);
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors: string[] = [];
  const requests: string[] = [];
  context.on('weberror', (error) => pageErrors.push(String(error.error())));
  context.on('request', (request) => requests.push(request.url()));
  return {
    context,
    page,
    pageErrors,
    requests,
    async close() {
      await context.close();
      rmSync(userDataDir, { recursive: true, force: true });
    },
  };
}

/** Waits until one of the rows xterm.js shows (its DOM renderer) reads `line`, trimmed. */
export async function waitForTerminalLine(page: Page, line: string): Promise<void> {
  const escaped = line.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  await page.locator('.xterm-rows > div').filter({ hasText: new RegExp(`^\\s*${escaped}\\s*$`) }).first().waitFor();
}
