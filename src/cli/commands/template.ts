import { readdir, readFile, stat } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { Command } from 'commander';
import { SandboxError } from '../../errors/index.js';
import { Template, type BuildLogEntry, type BuildTemplateRequest, type TemplateInfo } from '../../sdk/index.js';
import type { CliContext } from '../context.js';
import { collect } from '../options.js';
import { connection, inheritOutput, printJson, type ClientFlags } from './sandbox.js';

interface TemplateFlags extends ClientFlags {
  dataDir?: string;
}

interface BuildFlags extends TemplateFlags {
  tag: string;
  file?: string;
  buildArg?: string[];
  /** false with --no-cache (commander's negatable option). */
  cache?: boolean;
  progress?: boolean;
}

interface BootstrapFlags extends TemplateFlags {
  tag: string;
  suite?: string;
  packages?: string;
  progress?: boolean;
}

/** Context files a remote build sends at most (the server takes 48 MiB of JSON). */
const MAX_CONTEXT_BYTES = 32 * 1024 * 1024;

/** Remote when a server is named (--url or CAPSULE_URL), else the local data directory. */
function isRemote(flags: TemplateFlags, context: CliContext): boolean {
  return flags.url !== undefined || context.env.CAPSULE_URL !== undefined;
}

function withOptions(command: Command): Command {
  return command
    .option('--url <url>', 'Capsule server (default $CAPSULE_URL; none: the local data directory)')
    .option('--api-key <key>', 'API key (default $CAPSULE_API_KEY)')
    .option('--data-dir <dir>', 'local data directory when no server is named (default /var/lib/capsule)')
    .option('--json', 'print JSON on stdout');
}

function describe(t: TemplateInfo): string {
  const mib = (t.size.referencedBytes / 2 ** 20).toFixed(1);
  return `${`${t.name}:${t.tags.join(',')}`.padEnd(32)} ${t.id}  ${mib.padStart(8)} MiB  ${t.public ? 'public ' : 'own    '} ${t.source.padEnd(10)} ${t.createdAt}`;
}

/** A live log line on stderr (the result goes to stdout). */
function logger(context: CliContext, flags: { progress?: boolean; json?: boolean }): (entry: BuildLogEntry) => void {
  return (entry) => {
    if (flags.json && !flags.progress) return;
    context.stderr.write(`[${entry.step}] ${entry.message}\n`);
  };
}

/** The files of a build context, as a remote build sends them (a .dockerignore applies on the server). */
async function contextFiles(dir: string): Promise<{ path: string; data: string; mode: number }[]> {
  const files: { path: string; data: string; mode: number }[] = [];
  let total = 0;
  const walk = async (at: string): Promise<void> => {
    for (const entry of await readdir(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) await walk(path);
      else if (entry.isFile()) {
        const data = await readFile(path);
        total += data.length;
        if (total > MAX_CONTEXT_BYTES) {
          throw new SandboxError('PAYLOAD_TOO_LARGE', `the build context ${dir} is over ${MAX_CONTEXT_BYTES / 2 ** 20} MiB`, {
            hint: 'Build on the server itself (no --url), or keep large inputs out of the context and fetch them in a RUN step.',
          });
        }
        files.push({ path: relative(dir, path), data: data.toString('base64'), mode: (await stat(path)).mode & 0o7777 });
      }
    }
  };
  await walk(dir);
  return files;
}

/** The local template service on the data directory, with RUN steps in local sandboxes. */
async function localTemplates(dataDir: string | undefined): Promise<{ service: import('../../templates/index.js').TemplateService; close(): Promise<void> }> {
  const [{ openTemplateHost }, { SandboxStepRunner }, { DEFAULT_DATA_DIR }] = await Promise.all([
    import('../../engine/stored-templates.js'),
    import('../../engine/build-step-runner.js'),
    import('../../host/host-env.host.js'),
  ]);
  const steps: { runner?: InstanceType<typeof SandboxStepRunner> } = {};
  const { host, service } = openTemplateHost({ dataDir: dataDir ?? DEFAULT_DATA_DIR, stepRunner: { run: (step, options) => steps.runner!.run(step, options) } });
  steps.runner = new SandboxStepRunner({ host });
  await service.reconcile();
  return { service, close: () => steps.runner!.close() };
}

/** Runs `fn` with the local template service and its helpers, closed afterwards. */
async function withLocal<T>(dataDir: string | undefined, fn: (local: { service: import('../../templates/index.js').TemplateService; owner: string; info: (record: import('../../templates/index.js').TemplateRecord) => TemplateInfo }) => Promise<T>): Promise<T> {
  const [{ PUBLIC_OWNER }, { templateInfo }] = await Promise.all([import('../../templates/index.js'), import('../../server/routes/templates.js')]);
  const templates = await localTemplates(dataDir);
  try {
    // The local user's own machine: its templates are the operator's (public).
    return await fn({ service: templates.service, owner: PUBLIC_OWNER, info: templateInfo });
  } finally {
    await templates.close();
  }
}

async function build(request: BuildTemplateRequest, local: { contextDir?: string; dockerfile?: string }, flags: TemplateFlags & { progress?: boolean }, context: CliContext): Promise<TemplateInfo> {
  const onLog = logger(context, flags);
  if (isRemote(flags, context)) return Template.build(request, { ...connection(flags, context), onLog });
  const source = request.source.kind === 'dockerfile'
    ? { kind: 'dockerfile' as const, contextDir: local.contextDir!, dockerfile: local.dockerfile, buildArgs: request.source.buildArgs, noCache: request.source.noCache }
    : request.source;
  // Host paths allowed: the context is the local user's own directory.
  return withLocal(flags.dataDir, async ({ service, owner, info }) => info(await service.buildTemplate({ owner, name: request.name, source, allowHostPaths: true, onLog })));
}

function buildArgs(flags: string[] | undefined): Record<string, string> | undefined {
  if (!flags?.length) return undefined;
  return Object.fromEntries(flags.map((flag) => {
    const at = flag.indexOf('=');
    if (at <= 0) throw new SandboxError('INVALID_ARGUMENT', `--build-arg ${flag}: write NAME=VALUE`, { details: { field: '--build-arg' } });
    return [flag.slice(0, at), flag.slice(at + 1)];
  }));
}

/** `capsule template ls|inspect|rm|build|bootstrap`: on a server, or on the local data directory; `prune` and `push` locally. */
export function templateCommand(context: CliContext): Command {
  const group = new Command('template').description('Templates: root filesystems sandboxes start from (Debian bootstrap, OCI image, Dockerfile)');

  group.addCommand(
    withOptions(new Command('ls').description('List the templates you can use')).action(async (flags: TemplateFlags) => {
      const list = isRemote(flags, context)
        ? await Template.list(connection(flags, context))
        : await withLocal(flags.dataDir, async ({ service, owner, info }) => (await service.list(owner)).map(info));
      if (flags.json) return printJson(context, { templates: list });
      for (const t of list) context.stdout.write(`${describe(t)}\n`);
    }),
  );

  group.addCommand(
    withOptions(new Command('inspect').description('Show a template: config, parent, size, build').argument('<ref>', 'name[:tag] or id')).action(async (ref: string, flags: TemplateFlags) => {
      const template = isRemote(flags, context)
        ? await Template.get(ref, connection(flags, context))
        : await withLocal(flags.dataDir, async ({ service, owner, info }) => info(await service.resolve(owner, ref)));
      printJson(context, template);
    }),
  );

  group.addCommand(
    withOptions(new Command('rm').description('Remove a tag (a bare name: every tag); layers go at the next prune').argument('<ref>', 'name[:tag]')).action(async (ref: string, flags: TemplateFlags) => {
      const removed = isRemote(flags, context)
        ? await Template.delete(ref, connection(flags, context))
        : await withLocal(flags.dataDir, ({ service, owner }) => service.remove(owner, ref));
      if (flags.json) return printJson(context, { removed });
      for (const id of removed) context.stdout.write(`${id}\n`);
    }),
  );

  group.addCommand(
    withOptions(new Command('prune').description('Local: remove layers, image blobs and temps no template or build needs; prints what was freed')).action(async (flags: TemplateFlags) => {
      if (isRemote(flags, context)) {
        throw new SandboxError('UNIMPLEMENTED', 'prune runs on the server machine itself', { hint: 'Run capsule template prune there, without --url and CAPSULE_URL.' });
      }
      const report = await withLocal(flags.dataDir, ({ service }) => service.prune());
      if (flags.json) return printJson(context, report);
      context.stdout.write(`removed ${report.removedLayers.length} layers (${(report.freedLayerBytes / 2 ** 20).toFixed(1)} MiB), ${(report.freedImageCacheBytes / 2 ** 20).toFixed(1)} MiB of image blobs\n`);
    }),
  );

  group.addCommand(
    withOptions(
      new Command('build')
        .description('Build a template from a Dockerfile (FROM a template, an image or scratch; RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT)')
        .argument('<dir>', 'the build context')
        .requiredOption('-t, --tag <name[:tag]>', 'the template to make')
        .option('-f, --file <file>', 'the Dockerfile (default DIR/Dockerfile)')
        .option('--build-arg <name=value>', 'an ARG value (repeatable)', collect)
        .option('--no-cache', 'every step makes a new layer')
        .option('--progress', 'print the build log live on stderr (also with --json)'),
    ).action(async (dir: string, flags: BuildFlags) => {
      const dockerfilePath = flags.file ?? join(dir, 'Dockerfile');
      const remote = isRemote(flags, context);
      const source = {
        kind: 'dockerfile' as const,
        dockerfile: remote ? await readFile(dockerfilePath, 'utf8') : 'local',
        ...(remote ? { files: await contextFiles(dir) } : {}),
        ...(buildArgs(flags.buildArg) ? { buildArgs: buildArgs(flags.buildArg) } : {}),
        ...(flags.cache === false ? { noCache: true } : {}),
      };
      const result = await build({ name: flags.tag, source }, { contextDir: dir, dockerfile: flags.file }, flags, context);
      if (flags.json) return printJson(context, result);
      context.stdout.write(`${describe(result)}\n`);
    }),
  );

  group.addCommand(
    withOptions(
      new Command('push')
        .description("Local: push a template as a one-layer OCI image (its env, workdir, user and start command as the image config) to a registry, with the operator's credentials")
        .argument('<ref>', 'name[:tag] or id')
        .argument('<dest>', 'registry/name:tag (or oci:DIR:tag, oci-archive:FILE)')
        .option('--progress', 'print the push log live on stderr (also with --json)'),
    ).action(async (ref: string, dest: string, flags: TemplateFlags & { progress?: boolean }) => {
      if (isRemote(flags, context)) {
        throw new SandboxError('UNIMPLEMENTED', "push runs on the Capsule host itself, with the operator's registry credentials", { hint: 'Run capsule template push there, without --url and CAPSULE_URL.' });
      }
      const log = logger(context, flags);
      const pushed = await withLocal(flags.dataDir, ({ service, owner }) =>
        service.pushTemplate({ owner, ref, dest, allowHostPaths: true, onLog: (message) => log({ timestamp: new Date().toISOString(), level: 'info', message, step: 'push' }) }),
      );
      if (flags.json) return printJson(context, pushed);
      context.stdout.write(`${pushed.dest}@${pushed.digest}\n`);
    }),
  );

  const bootstrap = new Command('bootstrap').description('Make a template from scratch');
  bootstrap.addCommand(
    withOptions(
      new Command('debian')
        .description("Bootstrap Debian with mmdebstrap from the host's apt sources")
        .requiredOption('-t, --tag <name[:tag]>', 'the template to make')
        .option('--suite <suite>', "Debian suite (default: the host's)")
        .option('--packages <list>', 'comma-separated packages beyond ca-certificates, curl, iproute2, procps')
        .option('--progress', 'print the bootstrap log live on stderr (also with --json)'),
    ).action(async (flags: BootstrapFlags) => {
      const packages = flags.packages?.split(',').map((p) => p.trim()).filter((p) => p !== '');
      const source = { kind: 'debian' as const, ...(flags.suite ? { suite: flags.suite } : {}), ...(packages?.length ? { packages } : {}) };
      const result = await build({ name: flags.tag, source }, {}, flags, context);
      if (flags.json) return printJson(context, result);
      context.stdout.write(`${describe(result)}\n`);
    }),
  );
  group.addCommand(inheritOutput(bootstrap, context));
  return inheritOutput(group, context);
}
