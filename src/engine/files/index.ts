import type { BackendSandbox } from '../../backends/backend.js';
import { SandboxFileService, type SandboxFilesOptions } from './sandbox-files.js';

export { SandboxFileService, type SandboxFilesOptions } from './sandbox-files.js';
export { SandboxWatch } from './watch.js';
export { resolveSandboxPath } from './paths.js';
export { classifyFailure } from './errors.js';

/** File operations on a live sandbox, resolved as the sandbox sees its paths. */
export function createSandboxFiles(sandbox: BackendSandbox, options?: SandboxFilesOptions): SandboxFileService {
  return new SandboxFileService(sandbox, options);
}
