import { join } from 'node:path';
import type { TemplateConfig } from '../records.js';
import type { ImageRef } from './image-ref.js';
import { pushLayout, umoci, type ImageToolContext } from './image-tools.host.js';

/**
 * A template as an OCI image: one layer holding its whole root (owners and modes as on disk, ids
 * 0..65535), its env, working directory and user as the image config, its start command as
 * `Cmd: ["/bin/sh", "-c", line]` (an import reads that back as a start command). umoci builds it
 * in the export's temp dir; skopeo pushes it. The ready command has no place in an image config
 * and is not exported. Resolves with the pushed manifest's digest.
 */
export async function exportTemplateImage(options: { root: string; config: TemplateConfig; target: ImageRef; context: ImageToolContext }): Promise<string> {
  const { root, config, target, context } = options;
  const layout = join(context.tempDir, 'export');
  const image = `${layout}:export`;
  context.onLine('making the image layer');
  await umoci(['init', '--layout', layout], 'make a layout', context);
  await umoci(['new', '--image', image], 'make an image', context);
  await umoci(['insert', '--image', image, '--history.created_by', 'capsule template push', root, '/'], "add the template's root", context);
  const settings = [
    ...Object.entries(config.env).flatMap(([name, value]) => ['--config.env', `${name}=${value}`]),
    ...(config.workdir ? ['--config.workingdir', config.workdir] : []),
    ...(config.user ? ['--config.user', config.user] : []),
    ...(config.startCmd ? ['--config.cmd', '/bin/sh', '--config.cmd', '-c', '--config.cmd', config.startCmd] : []),
  ];
  await umoci(['config', '--image', image, '--history.created_by', 'capsule template push', ...settings], 'set the image config', context);
  context.onLine(`pushing to ${target.display}`);
  return pushLayout(layout, 'export', target, context);
}
