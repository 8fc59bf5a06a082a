#!/usr/bin/env node
// `capsule --version` is answered here, before anything else loads: a script asking for the
// version should cost no more than starting node. Everything else goes to the CLI, which loads
// only the command it runs (src/cli/command-table.ts), from the bundle scripts/build-cli.mjs makes.
import { readFileSync } from 'node:fs';

const args = process.argv.slice(2);
if (args.length === 1 && (args[0] === '--version' || args[0] === '-V')) {
  const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  process.stdout.write(`${version}\n`);
} else {
  const { main } = await import('../dist/cli/capsule.js');
  process.exitCode = await main(process.argv);
}
