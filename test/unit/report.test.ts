import { describe, expect, it } from 'vitest';
import { checkReport, compileReportSchema, tooLarge } from '../../src/engine/report.js';
import { HTTP_STATUS } from '../../src/errors/index.js';

const schema = {
  type: 'object',
  required: ['total', 'items'],
  additionalProperties: false,
  properties: {
    total: { type: 'number' },
    items: {
      type: 'array',
      items: { type: 'object', required: ['name', 'price'], properties: { name: { type: 'string' }, price: { type: 'number', minimum: 0 } } },
    },
  },
} as const;

describe('structured reports', () => {
  const validate = compileReportSchema(schema);

  it('returns a valid report as the object', () => {
    const report = { total: 3, items: [{ name: 'a', price: 1 }, { name: 'b', price: 2 }] };
    expect(checkReport(JSON.stringify(report), validate)).toEqual({ report });
  });

  it('gives REPORT_INVALID with the JSON Pointer of the bad field', () => {
    const out = checkReport(JSON.stringify({ total: 1, items: [{ name: 'a', price: 'cheap' }] }), validate);
    expect(out.report).toBeUndefined();
    expect(out.reportError?.code).toBe('REPORT_INVALID');
    expect(out.reportError && 'errors' in out.reportError ? out.reportError.errors : []).toEqual([
      { path: '/items/0/price', message: 'must be number' },
    ]);
    expect(out.reportError?.message).toBe('report /workspace/output/report.json is invalid at /items/0/price: must be number');
  });

  it('names the missing and the unexpected property in the path', () => {
    const out = checkReport(JSON.stringify({ items: [{ price: -1 }], extra: true }), validate);
    const paths = out.reportError && 'errors' in out.reportError ? out.reportError.errors.map((e) => e.path).sort() : [];
    expect(paths).toEqual(['/extra', '/items/0/name', '/items/0/price', '/total']);
  });

  it('reports JSON that does not parse as REPORT_INVALID at the root', () => {
    const out = checkReport('{"total": 1,', validate);
    expect(out.reportError?.code).toBe('REPORT_INVALID');
    expect(out.reportError && 'errors' in out.reportError ? out.reportError.errors[0]?.path : undefined).toBe('');
    expect(out.reportError?.message).toMatch(/not valid JSON/);
  });

  it('accepts any JSON when no schema is named', () => {
    expect(checkReport('[1, "two", null]')).toEqual({ report: [1, 'two', null] });
  });

  it('caps the number of schema errors and flags it', () => {
    const many = compileReportSchema({ type: 'array', items: { type: 'string' } });
    const out = checkReport(JSON.stringify(Array.from({ length: 50 }, (_, i) => i)), many);
    const error = out.reportError;
    expect(error && 'errors' in error ? [error.errors.length, error.errorsTruncated] : []).toEqual([20, true]);
  });

  it('refuses a schema that is not a JSON Schema with INVALID_ARGUMENT', () => {
    expect(() => compileReportSchema({ type: 'no-such-type' })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
  });

  it('uses draft 2020-12 (prefixItems)', () => {
    const tuple = compileReportSchema({ $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'array', prefixItems: [{ type: 'string' }, { type: 'number' }] });
    expect(checkReport('["a", 1]', tuple).report).toEqual(['a', 1]);
    expect(checkReport('[1, 1]', tuple).reportError).toMatchObject({ code: 'REPORT_INVALID', errors: [{ path: '/0' }] });
  });

  it('describes an oversized report as REPORT_TOO_LARGE with the truncation flag', () => {
    expect(tooLarge('/workspace/output/report.json', 2_000_000, 1_048_576)).toMatchObject({ code: 'REPORT_TOO_LARGE', truncated: true, sizeBytes: 2_000_000, limitBytes: 1_048_576 });
    expect([HTTP_STATUS.REPORT_INVALID, HTTP_STATUS.REPORT_TOO_LARGE]).toEqual([422, 413]);
  });
});
