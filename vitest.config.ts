import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Sandboxes are real processes on a 2-core machine: run files one at a time so limits and
    // timing-sensitive checks are not starved by a neighbour's fork bomb.
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    globalSetup: ['test/helpers/global-setup.ts'],
    reporters: ['default'],
  },
});
