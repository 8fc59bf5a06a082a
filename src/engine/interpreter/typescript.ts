import { SandboxError } from '../../errors/index.js';
import type { ExecutionError } from '../../wire/index.js';

type TypeScriptModule = typeof import('typescript');

export type StripResult = { code: string } | { error: ExecutionError };

/**
 * TypeScript for `ts` contexts: the host strips the types (typescript's transpileModule, no type
 * check) and the sandbox's Node runs the JavaScript. Node 20 has no built-in type stripping, and
 * the sandbox cannot see the host's node_modules. The compiler is loaded on first use only.
 */
export class TypeStripper {
  private loading: Promise<TypeScriptModule> | undefined;

  async strip(source: string, cellName: string): Promise<StripResult> {
    const ts = await this.load();
    const output = ts.transpileModule(source, {
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, isolatedModules: true },
      reportDiagnostics: true,
      fileName: `${cellName}.ts`,
    });
    const first = output.diagnostics?.[0];
    if (first === undefined) return { code: output.outputText };
    const message = ts.flattenDiagnosticMessageText(first.messageText, '\n');
    const where = first.file && first.start !== undefined ? first.file.getLineAndCharacterOfPosition(first.start) : undefined;
    const location = where ? `${cellName}.ts:${where.line + 1}:${where.character + 1}` : `${cellName}.ts`;
    return { error: { name: 'SyntaxError', value: message, traceback: `${location}\nSyntaxError: ${message} (TS${first.code})` } };
  }

  /** Starts loading the compiler (about a second) while a ts context's driver starts. */
  preload(): void {
    this.load().catch(() => undefined); // strip() reports a missing compiler
  }

  private load(): Promise<TypeScriptModule> {
    this.loading ??= import('typescript').then(
      (module: TypeScriptModule & { default?: TypeScriptModule }) => module.default ?? module,
      (error: unknown) => {
        this.loading = undefined;
        throw new SandboxError('UNIMPLEMENTED', 'TypeScript contexts need the typescript package on the Capsule host, and it is not installed', {
          cause: error,
          hint: 'Install it next to Capsule (npm install typescript), or use language "js".',
        });
      },
    );
    return this.loading;
  }
}
