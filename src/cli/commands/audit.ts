import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { SandboxError } from '../../errors/index.js';
import { DEFAULT_DATA_DIR } from '../../host/host-env.host.js';
import type { CliContext } from '../context.js';

/** Exit status when the chain is broken. */
export const EXIT_AUDIT_BROKEN = 1;

/** `capsule audit verify`: recomputes the audit log's hash chain offline. */
export function auditCommand(context: CliContext): Command {
  const audit = new Command('audit').description("Check the server's audit log");
  audit.addCommand(
    new Command('verify')
      .description('Recompute the hash chain; exit 1 naming the first record that does not match')
      .option('--data-dir <dir>', 'Capsule data directory', DEFAULT_DATA_DIR)
      .option('--json', 'print the result as one JSON object')
      .action(async (flags: { dataDir: string; json?: boolean }) => {
        const { DATABASE_FILE, openDatabase, verifyAuditChain } = await import('../../store/index.js');
        const file = join(flags.dataDir, DATABASE_FILE);
        if (!existsSync(file)) {
          throw new SandboxError('NOT_FOUND', `no Capsule database at ${file}`, {
            details: { path: file },
            hint: 'Pass the --data-dir the server runs with.',
          });
        }
        const db = openDatabase(flags.dataDir, { readOnly: true });
        try {
          const result = verifyAuditChain(db);
          if (flags.json === true) context.stdout.write(`${JSON.stringify(result)}\n`);
          else if (result.ok) context.stdout.write(`audit chain ok: ${result.records} records, head ${result.headHash}\n`);
          else context.stdout.write(`audit chain broken at record ${result.badSeq}: ${result.reason}\n`);
          if (!result.ok) context.exitCode = EXIT_AUDIT_BROKEN;
        } finally {
          db.close();
        }
      }),
  );
  return audit;
}
