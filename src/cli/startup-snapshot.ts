import { startupSnapshot } from 'node:v8';
import type { Command } from 'commander';
import { buildProgram, main } from './main.js';
import { specFromFlags } from './spec-flags.js';
import { parseSpec } from '../sandbox-spec/index.js';
import { withTemplate } from '../engine/template-start.js';
import { HOST_IMAGE } from '../engine/templates.js';
import { buildBwrapArgs, SECCOMP_FD } from '../backends/namespace/bwrap-args.js';
import { STAGE_DIR } from '../host/sandbox-layout.js';
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
 * At build time nothing runs but module evaluation and `compileRunPath`'s pure calls: no state
 * of the build (its environment, working directory, clock, random numbers) is taken into the
 * snapshot.
 */
if (startupSnapshot.isBuildingSnapshot()) {
  void compileRunPath();
  startupSnapshot.setDeserializeMainFunction(() => {
    if (process.env.CAPSULE_TRACE_STARTUP === '1') process.stderr.write('capsule: started from the startup snapshot\n');
    void main(process.argv).then((code) => {
      process.exitCode = code;
    });
  });
}

/**
 * Calls, once, the pure steps every run takes before it touches the host, so that the snapshot
 * holds their functions compiled (V8 compiles a function on its first call, and keeps the
 * bytecode in the snapshot): the run command is built and parses a command line (its action
 * replaced by one that does nothing), a default spec is parsed against the host template, and
 * its bwrap arguments are built. Measured: a run's argv parse 4–5 → 1–2 ms.
 */
async function compileRunPath(): Promise<void> {
  const sink = { write: () => true } as unknown as NodeJS.WritableStream;
  const program = await buildProgram({ stdout: sink, stderr: sink, env: {}, exitCode: 0 }, ['node', 'capsule', 'run']);
  let parsed: unknown;
  for (const command of program.commands as Command[]) command.action((_argv: string[], flags: object) => void (parsed = flags));
  await program.parseAsync(['node', 'capsule', 'run', '--timeout', '10s', '--', '/bin/true']);
  const spec = parseSpec(withTemplate(specFromFlags(parsed as object, { limits: { wallClockMs: 10_000 } }), HOST_IMAGE));
  buildBwrapArgs(spec, { stageDir: STAGE_DIR, seccompFd: SECCOMP_FD, shareNetwork: false, hasResolvConf: false });
}
