import { randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import type { NetworkPolicyInput } from '../../sandbox-spec/index.js';
import { BuildContext, type CopySelection } from '../dockerfile/context.js';
import type { CommandForm, Instruction } from '../dockerfile/parse.js';
import { processWord, type Lookup } from '../dockerfile/words.js';
import { hashParts } from '../keys.js';
import type { TemplateConfig, TemplateParent } from '../records.js';
import { shellJoin } from '../shell-quote.js';

const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** What FROM resolved to: a layer to start from and the config it brings. */
export interface BuildBase {
  layer: string;
  config: TemplateConfig;
  parent: TemplateParent;
}

export interface PlannedStep {
  /** 1-based index among the instructions after FROM (E2B's `step`). */
  step: string;
  line: number;
  text: string;
  /** copy and run make a layer; workdir makes one when the directory is missing; config never. */
  action: 'copy' | 'run' | 'workdir' | 'config';
  /** The cache key after this step: a layer made by the step is stored under it. */
  key: string;
  copy?: { selection: CopySelection; dest: string; chown?: string; chmod?: number };
  run?: { argv: string[]; env: Record<string, string>; cwd: string; user: string };
  workdir?: string;
}

export interface BuildPlan {
  base: BuildBase;
  /** The key FROM starts the chain with. */
  fromKey: string;
  steps: PlannedStep[];
  /** The template's config once every step ran. */
  config: TemplateConfig;
}

export interface PlanOptions {
  /** The tenant: cache keys are scoped to it, so one tenant's cache never answers another's. */
  owner: string;
  context: BuildContext;
  buildArgs: Record<string, string>;
  /** The RUN steps' network grant; part of their keys. */
  network: NetworkPolicyInput;
  /** Resolves FROM's (expanded) text: a template of the tenant's, an image, or scratch. */
  resolveBase: (from: string, line: number) => Promise<BuildBase>;
  /** Dockerfile name for messages. */
  file: string;
  /**
   * Who steps run as until a USER: `root` (Docker's rule, the default) or `base`, the base's own
   * user (E2B's rule: steps of a template start as its user, `user` in /home/user).
   */
  stepUser?: 'root' | 'base';
}

/**
 * Plans a build: FROM resolved once, then one cache key per step, each over the previous key, the
 * expanded instruction and the config in effect, plus the content digest of what a COPY selects
 * and, for RUN, its argv, environment, user, working directory and network grant (R1 §6). ENV,
 * ARG, WORKDIR and USER advance the chain; CMD and ENTRYPOINT only change the template's config.
 * A missing COPY source is found here, before anything is made.
 */
export async function planBuild(instructions: readonly Instruction[], options: PlanOptions): Promise<BuildPlan> {
  const fail = (line: number, message: string, hint?: string): never => {
    throw new SandboxError('INVALID_ARGUMENT', `${options.file}:${line}: ${message}`, { details: { file: options.file, line }, ...(hint ? { hint } : {}) });
  };
  const fromIndex = instructions.findIndex((i) => i.kind === 'FROM');
  const preFrom: Record<string, string> = {};
  for (const arg of instructions.slice(0, fromIndex)) {
    if (arg.kind !== 'ARG') continue;
    const value = options.buildArgs[arg.name] ?? (arg.default === undefined ? undefined : processWord(arg.default, (n) => preFrom[n]));
    if (value !== undefined) preFrom[arg.name] = value;
  }
  const from = instructions[fromIndex] as Extract<Instruction, { kind: 'FROM' }>;
  const base = await options.resolveBase(processWord(from.image, (n) => preFrom[n]), from.line);
  const env: Record<string, string> = { ...base.config.env };
  const args: Record<string, string> = {};
  let workdir = base.config.workdir;
  let user = options.stepUser === 'base' && base.config.user ? base.config.user : 'root';
  let finalUser: string | undefined;
  let entrypoint: CommandForm | undefined;
  let cmd: CommandForm | undefined;
  const lookup: Lookup = (name) => env[name] ?? args[name];
  const fromKey = hashParts('from', options.owner, base.layer);
  let key = fromKey;
  const steps: PlannedStep[] = [];
  const effective = () => ({ env: { ...env }, args: { ...args }, workdir, user });
  for (const [index, ins] of instructions.slice(fromIndex + 1).entries()) {
    const step = { step: String(index + 1), line: ins.line, text: ins.text };
    // A forced step (and with it every later one) is made anew: no earlier layer has its key.
    if (ins.force) key = hashParts(key, 'force', randomBytes(16).toString('hex'));
    switch (ins.kind) {
      case 'ENV': {
        const pairs = ins.pairs.map(([name, raw]) => [name, processWord(raw, lookup)] as const);
        for (const [name, value] of pairs) env[name] = value;
        key = hashParts(key, 'ENV', pairs);
        steps.push({ ...step, action: 'config', key });
        break;
      }
      case 'ARG': {
        const value = options.buildArgs[ins.name] ?? (ins.default !== undefined ? processWord(ins.default, lookup) : preFrom[ins.name]);
        if (value !== undefined) args[ins.name] = value;
        key = hashParts(key, 'ARG', ins.name);
        steps.push({ ...step, action: 'config', key });
        break;
      }
      case 'USER': {
        user = processWord(ins.user, lookup);
        if (user === '') fail(ins.line, 'USER names no user');
        finalUser = user;
        key = hashParts(key, 'USER', user);
        steps.push({ ...step, action: 'config', key });
        break;
      }
      case 'WORKDIR': {
        const path = processWord(ins.path, lookup);
        workdir = posix.resolve(workdir, path);
        key = hashParts(key, 'WORKDIR', workdir);
        steps.push({ ...step, action: 'workdir', key, workdir });
        break;
      }
      case 'CMD':
        cmd = ins.command;
        steps.push({ ...step, action: 'config', key });
        break;
      case 'ENTRYPOINT':
        entrypoint = ins.command;
        steps.push({ ...step, action: 'config', key });
        break;
      case 'COPY':
      case 'ADD': {
        const sources = ins.sources.map((s) => processWord(s, lookup));
        const rawDest = processWord(ins.dest, lookup);
        const dest = posix.resolve(workdir, rawDest) + (rawDest.endsWith('/') && rawDest !== '/' ? '/' : '');
        const chown = ins.chown === undefined ? undefined : processWord(ins.chown, lookup);
        const chmod = ins.chmod === undefined ? undefined : parseInt(ins.chmod, 8);
        const selection = await options.context.select(sources, dest, (message) => fail(ins.line, message));
        if (ins.kind === 'ADD') await refuseArchives(options.context, selection, ins.line, fail);
        key = hashParts(key, ins.kind, sources, dest, chown ?? '', chmod ?? '', selection.digest, effective());
        steps.push({ ...step, action: 'copy', key, copy: { selection, dest, ...(chown === undefined ? {} : { chown }), ...(chmod === undefined ? {} : { chmod }) } });
        break;
      }
      case 'RUN': {
        const argv = ins.command.form === 'exec' ? ins.command.argv : ['/bin/sh', '-c', ins.command.script];
        if (argv.length === 0) fail(ins.line, 'RUN has an empty command');
        const runEnv = { PATH: DEFAULT_PATH, ...args, ...env };
        const runUser = ins.user === undefined ? user : processWord(ins.user, lookup);
        if (runUser === '') fail(ins.line, 'RUN names no user');
        key = hashParts(key, 'RUN', argv, { ...effective(), user: runUser }, options.network);
        steps.push({ ...step, action: 'run', key, run: { argv, env: runEnv, cwd: workdir, user: runUser } });
        break;
      }
      case 'FROM':
        fail(ins.line, 'multi-stage builds are not supported: use one FROM');
    }
  }
  const startCmd = startCommand(entrypoint, cmd) ?? base.config.startCmd;
  const config: TemplateConfig = {
    env,
    workdir,
    user: finalUser ?? base.config.user,
    ...(startCmd ? { startCmd } : {}),
    ...(base.config.readyCmd ? { readyCmd: base.config.readyCmd } : {}),
  };
  return { base, fromKey, steps, config };
}

/**
 * The start command as a shell line. Docker's rule: an exec-form ENTRYPOINT takes CMD as its
 * arguments; a shell-form one ignores CMD. A shell form is its script as written.
 */
function startCommand(entrypoint: CommandForm | undefined, cmd: CommandForm | undefined): string | undefined {
  const argv = (form: CommandForm) => (form.form === 'exec' ? form.argv : ['/bin/sh', '-c', form.script]);
  const line = (form: CommandForm) => (form.form === 'exec' ? shellJoin(form.argv) : form.script);
  if (entrypoint) return entrypoint.form === 'shell' || !cmd ? line(entrypoint) : shellJoin([...argv(entrypoint), ...argv(cmd)]);
  return cmd ? line(cmd) : undefined;
}

/**
 * ADD extracts local tar archives in Docker; Capsule does not, and copying one silently would
 * differ, so an archive source is refused with the way to do it.
 */
async function refuseArchives(context: BuildContext, selection: CopySelection, line: number, fail: (line: number, message: string, hint?: string) => never): Promise<void> {
  for (const entry of selection.entries) {
    if (entry.type !== 'file' || !(await context.isArchive(entry.rel))) continue;
    fail(line, `ADD of the archive "${entry.rel}" is not supported (Capsule does not extract archives)`, 'COPY it and extract it in a RUN step (RUN tar -xf …).');
  }
}
