import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = fileURLToPath(new URL('.', import.meta.url));

/**
 * The web console: Preact, uPlot and xterm.js bundled into static files under dist/console,
 * served by `capsule serve` at /ui/ (no CDN, no second server).
 */
export default defineConfig({
  root: here,
  base: '/ui/',
  logLevel: 'warn',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: fileURLToPath(new URL('../dist/console', import.meta.url)),
    emptyOutDir: true,
    // No source maps in what the server ships; the page weight stays small.
    sourcemap: false,
    target: 'es2022',
    chunkSizeWarningLimit: 600,
  },
});
