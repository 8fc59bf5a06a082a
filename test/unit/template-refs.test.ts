import { describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { HTTP_STATUS } from '../../src/errors/status.js';
import { parseTemplateRef, templateNotFound } from '../../src/templates/names.js';
import { isLoopbackRegistry, parseImageRef } from '../../src/templates/oci/image-ref.js';
import { classifySkopeoError } from '../../src/templates/oci/skopeo-errors.js';
import { canonicalJson, hashParts, isLayerKey } from '../../src/templates/keys.js';

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (error) {
    return isSandboxError(error) ? error.code : 'not a SandboxError';
  }
  return undefined;
}

describe('template names', () => {
  it('parses name[:tag] with latest as the default tag', () => {
    expect(parseTemplateRef('base')).toEqual({ name: 'base', tag: 'latest', tagged: false });
    expect(parseTemplateRef('my-app.v2:2024_01')).toEqual({ name: 'my-app.v2', tag: '2024_01', tagged: true });
  });

  it('refuses names and tags outside the rules, with INVALID_ARGUMENT', () => {
    for (const bad of ['Base', '-x', 'a/b', '../etc', 'a:', 'a:-x', 'a:.x', '', `${'a'.repeat(64)}`]) expect(code(() => parseTemplateRef(bad)), bad).toBe('INVALID_ARGUMENT');
  });

  it('TEMPLATE_NOT_FOUND is a 404 whose hint names `capsule template ls`', () => {
    const error = templateNotFound('nope:v1');
    expect(error.code).toBe('TEMPLATE_NOT_FOUND');
    expect(HTTP_STATUS[error.code]).toBe(404);
    expect(error.hint).toContain('capsule template ls');
  });
});

describe('image references', () => {
  it('names Docker Hub images fully and keeps registries with ports', () => {
    expect(parseImageRef('debian')).toMatchObject({ registry: 'docker.io', repository: 'library/debian', tag: 'latest', transport: 'docker://docker.io/library/debian:latest' });
    expect(parseImageRef('python:3.12-slim')).toMatchObject({ repository: 'library/python', tag: '3.12-slim' });
    expect(parseImageRef('e2bdev/base')).toMatchObject({ registry: 'docker.io', repository: 'e2bdev/base' });
    expect(parseImageRef('127.0.0.1:5000/capsule/base:v2')).toMatchObject({ registry: '127.0.0.1:5000', repository: 'capsule/base', tag: 'v2' });
    expect(parseImageRef('localhost/x')).toMatchObject({ registry: 'localhost', repository: 'x', tag: 'latest' });
    const digest = `sha256:${'a'.repeat(64)}`;
    expect(parseImageRef(`docker://ghcr.io/o/r@${digest}`)).toMatchObject({ registry: 'ghcr.io', repository: 'o/r', digest, transport: `docker://ghcr.io/o/r@${digest}` });
    expect(parseImageRef(`ghcr.io/o/r@${digest}`)).not.toHaveProperty('tag', 'latest');
  });

  it('reads host paths only when absolute', () => {
    expect(parseImageRef('oci:/srv/layout:v1')).toEqual({ kind: 'oci', path: '/srv/layout', transport: 'oci:/srv/layout:v1', display: 'oci:/srv/layout:v1' });
    expect(parseImageRef('oci-archive:/tmp/i.tar')).toMatchObject({ kind: 'oci-archive', path: '/tmp/i.tar' });
    expect(parseImageRef('docker-archive:/tmp/d.tar')).toMatchObject({ kind: 'docker-archive' });
    expect(code(() => parseImageRef('oci:relative/dir:v1'))).toBe('INVALID_ARGUMENT');
  });

  it('refuses malformed references', () => {
    for (const bad of ['UPPER/case', 'a//b', 'x@sha256:12', 'host:99999999/x', 'x:bad tag', '']) expect(code(() => parseImageRef(bad)), bad).toBe('INVALID_ARGUMENT');
  });

  it('treats only loopback registries as plain HTTP', () => {
    expect(['127.0.0.1:5000', 'localhost:80', '[::1]:5000', '127.9.9.9'].every(isLoopbackRegistry)).toBe(true);
    expect(['10.0.0.1:5000', 'registry.example.com', '127.0.0.1.nip.io:5000'].some(isLoopbackRegistry)).toBe(false);
  });
});

describe('skopeo errors', () => {
  const line = (msg: string) => `time="2026-12-01T04:26:27Z" level=fatal msg="${msg}"`;

  it('classifies the texts containers/image prints', () => {
    const unreachable = classifySkopeoError('127.0.0.1:1/x:y', [line('Error parsing image name \\"docker://127.0.0.1:1/x:y\\": pinging container registry 127.0.0.1:1: Get \\"http://127.0.0.1:1/v2/\\": dial tcp 127.0.0.1:1: connect: connection refused')], false);
    expect(unreachable.code).toBe('REGISTRY_UNREACHABLE');
    expect(unreachable.message).toContain('connection refused');
    const unauthorized = classifySkopeoError('r/x:y', [line('Error parsing image name: reading manifest y in r/x: unauthorized: authentication required')], true);
    expect(unauthorized.code).toBe('REGISTRY_UNAUTHORIZED');
    expect(unauthorized.message).toContain('with the stored credentials');
    expect(classifySkopeoError('r/x:y', [line('reading manifest nope in 127.0.0.1:5000/x: manifest unknown: manifest unknown')], false).code).toBe('IMAGE_NOT_FOUND');
    expect(classifySkopeoError('oci:/l:zz', [line('no descriptor found for reference \\"zz\\"')], false).code).toBe('IMAGE_NOT_FOUND');
    expect(classifySkopeoError('x', ['something else entirely'], false).code).toBe('BUILD_FAILED');
  });
});

describe('layer keys', () => {
  it('are sha256 hex, length-prefixed, and independent of object key order', () => {
    const key = hashParts('a', { b: 1, c: [2, { d: 3, e: 4 }] });
    expect(isLayerKey(key)).toBe(true);
    expect(hashParts('a', { c: [2, { e: 4, d: 3 }], b: 1 })).toBe(key);
    expect(hashParts('ab', 'c')).not.toBe(hashParts('a', 'bc'));
    expect(canonicalJson({ z: 1, a: { y: 2, b: 3 } })).toBe('{"a":{"b":3,"y":2},"z":1}');
  });
});
