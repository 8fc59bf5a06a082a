import { startupSnapshot } from 'node:v8';
import { main } from './main.js';
// Loaded here, not when the command runs: the snapshot holds the run path evaluated, its zod
// schemas built, so a `capsule run` started from it compiles and evaluates none of it again.
import './commands/run.js';

/**
 * The entry of the CLI's startup snapshot (decision 021): scripts/build-cli.mjs bundles this
 * file with the run path into one CommonJS file and has node build a snapshot of the heap after
 * it ran (`node --build-snapshot`). `bin/capsule` starts node from that snapshot for `capsule
 * run` (`node --snapshot-blob`), and node then calls the function registered below instead of
 * loading a script: the argv is the command line, as with `node bin/capsule.js`.
 *
 * Nothing here runs at build time but module evaluation: no state of the build (its environment,
 * working directory, clock, random numbers) is taken into the snapshot.
 */
if (startupSnapshot.isBuildingSnapshot()) {
  startupSnapshot.setDeserializeMainFunction(() => {
    if (process.env.CAPSULE_TRACE_STARTUP === '1') process.stderr.write('capsule: started from the startup snapshot\n');
    void main(process.argv).then((code) => {
      process.exitCode = code;
    });
  });
}
