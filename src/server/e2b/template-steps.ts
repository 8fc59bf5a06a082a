import { z } from 'zod';
import { SandboxError } from '../../errors/index.js';
import type { Instruction } from '../../templates/index.js';

/** E2B's build start body (`POST /v2/templates/{templateID}/builds/{buildID}`, TemplateBuildStartV2). */
export const TemplateBuildStartBody = z
  .object({
    force: z.boolean().optional(),
    fromImage: z.string().max(1024).optional(),
    fromImageRegistry: z.unknown().optional(),
    fromTemplate: z.string().max(200).optional(),
    readyCmd: z.string().max(8192).optional(),
    startCmd: z.string().max(8192).optional(),
    steps: z
      .array(
        z
          .object({
            type: z.string().min(1).max(32),
            args: z.array(z.string().max(64 * 1024)).max(1000).optional(),
            filesHash: z.string().max(128).optional(),
            force: z.boolean().optional(),
          })
          .loose(),
      )
      .max(500)
      .optional(),
  })
  .loose();

export type TemplateBuildStart = z.infer<typeof TemplateBuildStartBody>;

/** The file a COPY step needs: the tar the SDK uploaded under `hash`, unpacked into `dir` of the context. */
export interface StepFiles {
  step: number;
  hash: string;
  /** The directory of the build context the step's tar is unpacked into. */
  dir: string;
}

/** E2B's template, as Capsule builds it: a Dockerfile-equivalent list of instructions. */
export interface TranslatedTemplate {
  /** What FROM names: a Capsule template or an image reference. */
  from: string;
  /** Whether the base must be a template (fromTemplate, E2B's base image): never pulled as an image. */
  fromTemplate: boolean;
  /** FROM first, then one instruction per E2B step, so Capsule's step numbers are E2B's. */
  instructions: Instruction[];
  files: StepFiles[];
  config: { startCmd?: string; readyCmd?: string };
  /** E2B's `force` on the whole build (`skipCache` before FROM, or `Template.build({ skipCache })`). */
  noCache: boolean;
}

/** E2B's base image (`fromBaseImage()`, and a template with no FROM): Capsule's default template `base`. */
const E2B_BASE_IMAGE = /^(?:docker\.io\/)?e2bdev\/base(?::[\w.-]+)?$/;
export const CAPSULE_BASE_TEMPLATE = 'base';
export const HASH = /^[0-9a-f]{64}$/;

/**
 * Installers that need a package registry on the internet. A build's RUN steps reach only the
 * host's apt sources, so these would fail after minutes with a network error; they are refused
 * at once instead, saying what does work. Matched on the commands the SDK's helpers generate.
 */
const UNREACHABLE: { pattern: RegExp; helper: string; needs: string; instead: string }[] = [
  { pattern: /^\s*pip3?\s+install\b/, helper: 'pipInstall', needs: 'PyPI (pypi.org)', instead: "Install Debian's packaging of it with aptInstall (e.g. python3-requests)" },
  { pattern: /^\s*npm\s+install\b/, helper: 'npmInstall', needs: 'the npm registry (registry.npmjs.org)', instead: "Install Debian's packaging of it with aptInstall (e.g. node-typescript), or copy the package in with copy()" },
  { pattern: /^\s*bun\s+install\b/, helper: 'bunInstall', needs: 'the npm registry (registry.npmjs.org)', instead: 'Copy the dependencies in with copy()' },
  { pattern: /^\s*git\s+clone\b/, helper: 'gitClone', needs: 'the git host', instead: 'Copy the repository in with copy()' },
];

function invalid(message: string, details: Record<string, unknown>, hint?: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', message, { details, ...(hint ? { hint } : {}) });
}

/** A word of a Dockerfile instruction taken literally: single-quoted, so nothing is expanded. */
export function literalWord(text: string): string {
  return `'${text.replace(/'/g, "'\\''")}'`;
}

/** A word that keeps `$VAR` expansion (ENV values, as Docker and E2B expand them) but is one word. */
function expandedWord(text: string): string {
  return `"${text.replace(/["\\]/g, (c) => `\\${c}`)}"`;
}

/**
 * Translates E2B's template (the SDK's `serialize()`: a base, steps, start and ready commands) into
 * Capsule's build: FROM the base, then RUN / COPY / ENV / WORKDIR / USER one for one. What cannot
 * be honoured is refused by name before anything runs: registry credentials from the tenant (the
 * operator's alone), installers that need the internet, unknown step types.
 */
export function translateTemplate(body: TemplateBuildStart): TranslatedTemplate {
  if (body.fromImageRegistry !== undefined) {
    throw new SandboxError('PERMISSION_DENIED', 'fromImage with registry credentials (fromImageRegistry, fromAWSRegistry, fromGCPRegistry) is not supported: registry credentials are the operator\'s, never a tenant\'s', {
      details: { field: 'fromImageRegistry' },
      hint: 'Ask the operator to store the registry\'s credentials for Capsule (<dataDir>/registry-auth.json), then use fromImage without credentials.',
    });
  }
  const image = body.fromImage?.trim() ?? '';
  const template = body.fromTemplate?.trim() ?? '';
  if ((image === '') === (template === '')) {
    throw invalid('a template build needs exactly one of fromImage and fromTemplate', { field: 'fromImage' }, 'Start the template with fromTemplate("base") or fromImage("registry/name:tag").');
  }
  const from = template !== '' ? template : E2B_BASE_IMAGE.test(image) ? CAPSULE_BASE_TEMPLATE : image;
  const instructions: Instruction[] = [{ kind: 'FROM', line: 0, text: `FROM ${from}`, image: literalWord(from) }];
  const files: StepFiles[] = [];
  for (const [index, step] of (body.steps ?? []).entries()) {
    const n = index + 1;
    const args = step.args ?? [];
    const at = { line: n, ...(step.force ? { force: true } : {}) };
    const need = (count: number, what: string) => {
      if (args.length < count) throw invalid(`step ${n}: ${step.type} needs ${what}`, { step: String(n), type: step.type });
    };
    switch (step.type) {
      case 'RUN': {
        need(1, 'a command');
        const [command = '', user = ''] = args;
        for (const installer of UNREACHABLE) {
          if (!installer.pattern.test(command)) continue;
          throw new SandboxError('UNIMPLEMENTED', `step ${n}: ${installer.helper} (\`${command.slice(0, 120)}\`) needs ${installer.needs}, which a Capsule build cannot reach: RUN steps reach only the host's apt sources`, {
            details: { step: String(n), type: step.type },
            hint: `${installer.instead}.`,
          });
        }
        instructions.push({ ...at, kind: 'RUN', text: `RUN ${command}`, command: { form: 'shell', script: command }, ...(user !== '' ? { user: literalWord(user) } : {}) });
        break;
      }
      case 'COPY': {
        need(2, 'a source and a destination');
        const [src = '', dest = '', user = '', mode = ''] = args;
        if (!step.filesHash || !HASH.test(step.filesHash)) throw invalid(`step ${n}: COPY ${src} needs the hash of its files (filesHash, 64 hex digits)`, { step: String(n), field: 'filesHash' });
        if (mode !== '' && !/^[0-7]{3,4}$/.test(mode)) throw invalid(`step ${n}: COPY mode "${mode}" is not octal permissions like 0755`, { step: String(n), field: 'mode' });
        const dir = `step-${n}`;
        files.push({ step: n, hash: step.filesHash, dir });
        instructions.push({
          ...at,
          kind: 'COPY',
          text: `COPY ${src} ${dest}`,
          sources: [literalWord(`${dir}/${src}`)],
          dest: literalWord(dest),
          ...(user !== '' ? { chown: literalWord(user) } : {}),
          ...(mode !== '' ? { chmod: mode } : {}),
        });
        break;
      }
      case 'ENV': {
        if (args.length === 0 || args.length % 2 !== 0) throw invalid(`step ${n}: ENV takes name, value pairs`, { step: String(n), type: step.type });
        const pairs: [string, string][] = [];
        for (let i = 0; i < args.length; i += 2) {
          const name = args[i]!;
          if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw invalid(`step ${n}: "${name}" is not a valid environment variable name`, { step: String(n), field: 'args' });
          pairs.push([name, expandedWord(args[i + 1]!)]);
        }
        instructions.push({ ...at, kind: 'ENV', text: `ENV ${pairs.map(([k]) => k).join(' ')}`, pairs });
        break;
      }
      case 'WORKDIR':
        need(1, 'a path');
        instructions.push({ ...at, kind: 'WORKDIR', text: `WORKDIR ${args[0]}`, path: literalWord(args[0]!) });
        break;
      case 'USER':
        need(1, 'a user');
        instructions.push({ ...at, kind: 'USER', text: `USER ${args[0]}`, user: literalWord(args[0]!) });
        break;
      default:
        throw invalid(`step ${n}: the step type "${step.type}" is not supported`, { step: String(n), type: step.type }, 'Capsule builds RUN, COPY, ENV, WORKDIR and USER steps (runCmd, copy, setEnvs, setWorkdir, setUser and the helpers made of them).');
    }
  }
  const config = { ...(body.startCmd ? { startCmd: body.startCmd } : {}), ...(body.readyCmd ? { readyCmd: body.readyCmd } : {}) };
  return { from, fromTemplate: template !== '' || from === CAPSULE_BASE_TEMPLATE, instructions, files, config, noCache: body.force === true };
}
