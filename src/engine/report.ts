import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import { SandboxError } from '../errors/index.js';
import { readBounded } from '../host/output-files.host.js';
import type { BackendSandbox } from '../backends/backend.js';

export const DEFAULT_REPORT_PATH = '/workspace/output/report.json';
export const DEFAULT_REPORT_MAX_BYTES = 1024 * 1024;
/** Schema errors past this count are summarised by `errorsTruncated`. */
const MAX_REPORTED_ERRORS = 20;

export interface ReportOptions {
  /** Sandbox path of the report file; must be under /workspace. @default '/workspace/output/report.json' */
  path?: string;
  /** A JSON Schema (draft 2020-12) the report must satisfy. */
  schema?: object;
  /** A larger report is refused with REPORT_TOO_LARGE, never cut. @default 1 MiB */
  maxBytes?: number;
}

export interface ReportFieldError {
  /** JSON Pointer of the offending value, e.g. `/items/0/price` (`` is the whole report). */
  path: string;
  message: string;
}

export type ReportError =
  | { code: 'REPORT_INVALID'; message: string; errors: ReportFieldError[]; errorsTruncated?: boolean }
  | { code: 'REPORT_TOO_LARGE'; message: string; truncated: true; sizeBytes: number; limitBytes: number };

/** What a run or exec returns about its report: the object, an error, or neither (no report). */
export interface ReportOutcome {
  report?: unknown;
  reportError?: ReportError;
}

export type ReportValidator = ValidateFunction;

/**
 * Compiles a report schema once, before any sandbox is created, so a bad schema is the caller's
 * INVALID_ARGUMENT and not a failed run.
 */
export function compileReportSchema(schema: object): ReportValidator {
  try {
    return new Ajv2020({ allErrors: true, strict: false }).compile(schema);
  } catch (error) {
    throw new SandboxError('INVALID_ARGUMENT', `reportSchema is not a valid JSON Schema: ${(error as Error).message}`, {
      details: { field: 'reportSchema' },
      hint: 'Pass a JSON Schema (draft 2020-12) object, e.g. { "type": "object", "required": ["answer"] }.',
      cause: error,
    });
  }
}

/** Parses and validates report bytes. Pure: no file access. */
export function checkReport(data: Buffer | string, validate?: ReportValidator, reportPath = DEFAULT_REPORT_PATH): ReportOutcome {
  let report: unknown;
  try {
    report = JSON.parse(typeof data === 'string' ? data : data.toString('utf8'));
  } catch (error) {
    return invalid(reportPath, [{ path: '', message: `not valid JSON: ${(error as Error).message}` }]);
  }
  if (!validate || validate(report)) return { report };
  const all = (validate.errors ?? []).map(fieldError);
  return invalid(reportPath, all.slice(0, MAX_REPORTED_ERRORS), all.length > MAX_REPORTED_ERRORS);
}

/** Reads the report file of a (frozen) sandbox; no file and no schema means no report. */
export async function readReport(sandbox: BackendSandbox, options: ReportOptions & { validate?: ReportValidator } = {}): Promise<ReportOutcome> {
  const path = options.path ?? DEFAULT_REPORT_PATH;
  const maxBytes = options.maxBytes ?? DEFAULT_REPORT_MAX_BYTES;
  const validate = options.validate ?? (options.schema ? compileReportSchema(options.schema) : undefined);
  const read = await readBounded(sandbox.workspaceDir, path, maxBytes);
  switch (read.kind) {
    case 'ok':
      return checkReport(read.data, validate, path);
    case 'too_large':
      return { reportError: tooLarge(path, read.size, maxBytes) };
    case 'not_regular':
      return invalid(path, [{ path: '', message: `${path} is a ${read.reason === 'symlink' ? 'symlink (not followed)' : 'special file'}, not a regular file` }]);
    case 'missing':
      return validate ? invalid(path, [{ path: '', message: `no report was written at ${path}` }]) : {};
  }
}

export function tooLarge(path: string, sizeBytes: number, limitBytes: number): ReportError {
  return {
    code: 'REPORT_TOO_LARGE',
    message: `report ${path} has ${sizeBytes} bytes, over the ${limitBytes}-byte limit; it was not read (nothing was cut). Write a smaller report and put bulk data in artifacts.`,
    truncated: true,
    sizeBytes,
    limitBytes,
  };
}

function invalid(path: string, errors: ReportFieldError[], errorsTruncated = false): ReportOutcome {
  const first = errors[0];
  const where = first?.path ? ` at ${first.path}` : '';
  return {
    reportError: {
      code: 'REPORT_INVALID',
      message: `report ${path} is invalid${where}: ${first?.message ?? 'unknown error'}${errors.length > 1 ? ` (and ${errors.length - 1} more)` : ''}`,
      errors,
      ...(errorsTruncated ? { errorsTruncated } : {}),
    },
  };
}

/** Ajv's error as a pointer to the bad field: `required` and `additionalProperties` name the property. */
function fieldError(error: ErrorObject): ReportFieldError {
  const params = error.params as { missingProperty?: string; additionalProperty?: string };
  const property = params.missingProperty ?? params.additionalProperty;
  const path = property === undefined ? error.instancePath : `${error.instancePath}/${escapePointer(property)}`;
  return { path, message: error.message ?? error.keyword };
}

function escapePointer(segment: string): string {
  return segment.replace(/~/g, '~0').replace(/\//g, '~1');
}
