import { describe, expect, it } from 'vitest';
import { conflictingPaths } from '../../src/engine/changes/diff.js';
import { splitDumpLine, TouchedPaths } from '../../src/engine/changes/send-dump.js';
import type { TreeChange } from '../../src/host/tree-diff.host.js';

describe('btrfs receive --dump lines', () => {
  it('undo the escapes btrfs-progs prints (space, backslash, octal bytes as UTF-8)', () => {
    expect(splitDumpLine('mkfile          ./snap/a\\ b\\\\c')).toEqual(['mkfile', './snap/a b\\c']);
    expect(splitDumpLine('write ./snap/caf\\303\\251 offset=0 len=5')).toEqual(['write', './snap/café', 'offset=0', 'len=5']);
  });

  it('collect touched paths relative to the subvolume: renames on both sides, links by their existing name', () => {
    const touched = new TouchedPaths(100);
    for (const line of [
      'snapshot        ./view                          uuid=x transid=1 parent_uuid=y parent_transid=1',
      'mkfile          ./view/o257-7-0',
      'rename          ./view/o257-7-0                 dest=./view/new.txt',
      'link            ./view/hard                     dest=new.txt',
      'symlink         ./view/l                        dest=../outside',
      'unlink          ./view/gone',
      'chown           ./view/new.txt                  gid=1 uid=1',
    ]) touched.push(line);
    expect([...touched.paths].sort()).toEqual(['gone', 'hard', 'l', 'new.txt', 'o257-7-0']);
    expect(touched.truncated).toBe(false);
  });

  it('stop at the limit and say the list is incomplete', () => {
    const touched = new TouchedPaths(2);
    for (const name of ['a', 'b', 'c']) touched.push(`mkfile ./s/${name}`);
    expect(touched.paths.size).toBe(2);
    expect(touched.truncated).toBe(true);
  });
});

const change = (path: string, kind: TreeChange['kind'], type: TreeChange['type'] = 'file', mode = 0o644): TreeChange => ({ path, kind, type, mode, sizeBytes: 0 });

describe('conflicts between a parent and its fork', () => {
  it('the same path changed on both sides is a conflict', () => {
    expect(conflictingPaths([change('a', 'modified')], [change('a', 'modified')])).toEqual(['a']);
    expect(conflictingPaths([change('a', 'deleted')], [change('a', 'modified')])).toEqual(['a']);
  });

  it('different paths, and directories both made alike, are not', () => {
    expect(conflictingPaths([change('a', 'added')], [change('b', 'added')])).toEqual([]);
    expect(conflictingPaths([change('d', 'added', 'dir', 0o755), change('d/x', 'added')], [change('d', 'added', 'dir', 0o755), change('d/y', 'added')])).toEqual([]);
  });

  it('a directory deleted on one side with a change inside it on the other is', () => {
    expect(conflictingPaths([change('d', 'deleted', 'dir')], [change('d/x', 'added')])).toEqual(['d']);
    expect(conflictingPaths([change('d/x', 'added')], [change('d', 'deleted', 'dir')])).toEqual(['d']);
  });
});
