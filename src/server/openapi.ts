import { z } from 'zod';
import type { AnyRoute } from './route.js';
import { ErrorBodySchema } from '../wire/index.js';

type JsonObject = Record<string, unknown>;

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): JsonObject {
  const { $schema: _ignored, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as JsonObject;
  return rest;
}

/** Fastify `:name` segments as OpenAPI `{name}`. */
function openapiPath(url: string): string {
  return url.replace(/:([A-Za-z_]+)/g, '{$1}');
}

function parameters(route: AnyRoute): JsonObject[] {
  const list: JsonObject[] = [];
  for (const name of route.url.match(/:([A-Za-z_]+)/g) ?? []) {
    list.push({ name: name.slice(1), in: 'path', required: true, schema: { type: 'string' } });
  }
  if (route.query) {
    const schema = jsonSchema(route.query, 'input');
    const properties = (schema.properties ?? {}) as Record<string, JsonObject>;
    const required = new Set((schema.required ?? []) as string[]);
    for (const [name, property] of Object.entries(properties)) {
      list.push({ name, in: 'query', required: required.has(name), schema: property });
    }
  }
  if (route.method !== 'GET') {
    list.push({ name: 'Idempotency-Key', in: 'header', required: false, schema: { type: 'string', minLength: 1, maxLength: 200 } });
  }
  return list;
}

/** The OpenAPI 3.1 document of the routes, generated from the same zod schemas they validate with. */
export function buildOpenApi(routes: readonly AnyRoute[], version: string): JsonObject {
  const paths: Record<string, Record<string, unknown>> = {};
  const errorSchema = jsonSchema(ErrorBodySchema, 'output');
  for (const route of routes) {
    const responses: Record<string, unknown> = {};
    for (const [status, doc] of Object.entries(route.responses ?? {})) {
      responses[status] = {
        description: doc.description,
        ...(doc.schema || doc.contentType ? { content: { [doc.contentType ?? 'application/json']: { schema: doc.schema ? jsonSchema(doc.schema, 'output') : { type: 'string', format: 'binary' } } } } : {}),
      };
    }
    responses.default = { description: 'Error', content: { 'application/json': { schema: errorSchema } } };
    const body = route.bodyDoc ?? route.body;
    const operation: JsonObject = {
      operationId: route.name,
      summary: route.summary,
      parameters: parameters(route),
      responses,
      ...(route.auth === 'none' ? { security: [] } : {}),
    };
    if (route.rawBody) {
      operation.requestBody = { required: true, content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } };
    } else if (body) {
      operation.requestBody = { required: !body.safeParse(undefined).success, content: { 'application/json': { schema: jsonSchema(body, 'input') } } };
    }
    (paths[openapiPath(route.url)] ??= {})[route.method.toLowerCase()] = operation;
  }
  return {
    openapi: '3.1.0',
    info: { title: 'Capsule API', version, description: 'Sandboxes for AI agents. See docs/api.md.' },
    components: {
      securitySchemes: {
        bearer: { type: 'http', scheme: 'bearer' },
        apiKeyHeader: { type: 'apiKey', in: 'header', name: 'X-API-Key' },
      },
    },
    security: [{ bearer: [] }, { apiKeyHeader: [] }],
    paths,
  };
}
