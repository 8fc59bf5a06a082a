import { z } from 'zod';
import { outputLogInfo, readOutputLog, type OutputLogEntry } from '../../engine/output-log.js';
import { SandboxError } from '../../errors/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, LogLineSchema, ProcessParams, SandboxIdParams, UsageSampleSchema } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

async function* wireLog(entries: AsyncIterable<OutputLogEntry>): AsyncGenerator<object> {
  for await (const entry of entries) yield { t: entry.t, stream: entry.stream, data: entry.data.toString('base64') };
}

/** A process the engine still knows writes what it holds, so the file has all its output so far. */
async function flushLogOf(services: ServerServices, tenantId: string, sandboxId: string, pid: number): Promise<void> {
  let handle;
  try {
    handle = services.engine.getProcess(tenantId, sandboxId, pid);
  } catch {
    return; // ended, or from before a restart: its log on disk is complete
  }
  await handle.flushLog();
}

/** Per-sandbox usage over time and the full output log of a process. */
export function usageRoutes(services: ServerServices): AnyRoute[] {
  const routes: AnyRoute[] = [
    defineRoute({
      name: 'sandboxes.metrics',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/metrics',
      summary: 'CPU, memory and disk use over time (a sample every 5 s, the last 120, plus one taken now)',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'Samples, oldest first', schema: z.object({ samples: z.array(UsageSampleSchema) }) }, 404: error('No such sandbox') },
      async handler({ params, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        return { kind: 'json', status: 200, body: { samples: await services.engine.usage(principal.tenantId, params.sandboxId) } };
      },
    }),
  ];
  const { processLogs } = services;
  if (processLogs) {
    routes.push(
      defineRoute({
        name: 'processes.log',
        method: 'GET',
        url: '/v1/sandboxes/:sandboxId/processes/:pid/log',
        summary: 'The output of a process as NDJSON lines {t, stream, data (base64)}: all within the caps, then up to 64 MiB more',
        auth: 'tenant',
        params: ProcessParams,
        responses: {
          200: { description: 'NDJSON log lines', schema: LogLineSchema, contentType: 'application/x-ndjson' },
          404: error('No such process, or its log was removed'),
        },
        async handler({ params, principal, signal }) {
          requireSandbox(services, principal.tenantId, params.sandboxId);
          await flushLogOf(services, principal.tenantId, params.sandboxId, params.pid);
          const where = { dataDir: processLogs.dataDir, sandboxId: params.sandboxId, pid: params.pid };
          if (!(await outputLogInfo(where)).exists) {
            throw new SandboxError('PROCESS_NOT_FOUND', `process ${params.pid} of sandbox ${params.sandboxId} has no output log`, {
              details: { sandboxId: params.sandboxId, pid: params.pid },
              hint: 'List the processes of the sandbox; logs are kept while it lives and for an hour after it ends.',
            });
          }
          return { kind: 'ndjson', status: 200, events: wireLog(readOutputLog({ ...where, signal })) };
        },
      }),
    );
  }
  return routes;
}
