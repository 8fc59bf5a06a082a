import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LOG_HEADER_BYTES, readLogRecords } from '../../src/engine/output-log.js';
import { ProcessOutput, type LogBudget, type OutputPiece } from '../../src/engine/process-output.js';

// Made in a hook: collecting the tests (`vitest list`) runs none, and would leave the directory.
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'capsule-process-output-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let next = 0;

function output(options: { reservedBytes?: number; extraBytes?: number; budget?: LogBudget } = {}): { log: ProcessOutput; path: string } {
  const path = join(dir, `${next++}.output`);
  return { log: new ProcessOutput({ path, ensureDir: () => Promise.resolve(), ...options }), path };
}

/** Reads pieces until `bytes` were read (or the reader ends). */
async function take(reader: AsyncGenerator<OutputPiece>, bytes: number): Promise<string> {
  let text = '';
  while (text.length < bytes) {
    const step = await reader.next();
    if (step.done === true) break;
    text += step.value.data.toString();
  }
  return text;
}

/** A budget with `room` bytes, counting what it holds. */
function budget(room: number): LogBudget & { held: number } {
  const b = {
    held: 0,
    take(bytes: number) {
      if (b.held + bytes > room) return false;
      b.held += bytes;
      return true;
    },
    release(bytes: number) {
      b.held -= bytes;
    },
  };
  return b;
}

describe('ProcessOutput (the log a process is replayed from)', () => {
  it('a flush after close (a reader of the log file) opens nothing again: the log and a copy read back from its extent replay it all', async () => {
    const { log, path } = output();
    log.append('stdout', Buffer.from('first\n'), true);
    log.append('stderr', Buffer.from('second\n'), true);
    await log.close();
    const extent = log.extent;
    await log.flush();
    // Reopening would take the file's end for this log's start: readers would find nothing, forever.
    expect(log.extent).toEqual(extent);
    const reader = log.read(() => undefined);
    expect(await take(reader, 13)).toBe('first\nsecond\n');
    // Ended as a stream's reader ends it (coalesce calls return): the file it read is closed.
    await reader.return(undefined);
    const copy = ProcessOutput.ofClosed(path, extent);
    const pieces: string[] = [];
    for await (const piece of copy.read(() => undefined)) pieces.push(`${piece.stream}:${piece.data.toString()}`);
    expect(pieces).toEqual(['stdout:first\n', 'stderr:second\n']);
  });

  it('gives a late reader the output from the file, and a reader that keeps up the output from memory', async () => {
    const { log } = output();
    const live = log.read(() => undefined);
    log.append('stdout', Buffer.from('one '), true);
    expect(await take(live, 4)).toBe('one ');
    log.append('stderr', Buffer.from('two '), true);
    await log.flush();
    log.append('stdout', Buffer.from('three'), true);
    expect(await take(live, 9)).toBe('two three');
    const late = log.read(() => log.position);
    expect(await take(late, 100)).toBe('one two three');
    await log.close();
  });

  it('continues a reader from the file in the middle of a record it began in memory', async () => {
    const { log } = output();
    const reader = log.read(() => log.position);
    // Small neighbours of one stream share a record on disk; the reader saw them one by one.
    for (const part of ['ab', 'cd', 'ef']) log.append('stdout', Buffer.from(part), true);
    expect(await take(reader, 2)).toBe('ab');
    await log.flush();
    expect(await take(reader, 4)).toBe('cdef');
    await log.close();
    expect((await reader.next()).done).toBe(true);
  });

  it('logs output past the caps only while it has room, and never lets it take the room of kept output', async () => {
    const { log, path } = output({ extraBytes: 100, reservedBytes: 2 * (LOG_HEADER_BYTES + 10) });
    expect(log.append('stdout', Buffer.alloc(60, 'x'), false)).toBe(true);
    expect(log.append('stdout', Buffer.alloc(60, 'y'), false)).toBe(false); // over the extra room
    expect(log.append('stderr', Buffer.alloc(10, 'k'), true)).toBe(true); // kept: from the reservation
    expect(log.droppedBytes).toBe(60);
    const { bytes } = await log.close();
    expect(bytes).toBe(statSync(path).size);
    const records = [];
    for await (const record of readLogRecords(path, 0, bytes)) records.push(`${record.stream}:${record.data.toString()}`);
    expect(records).toEqual([`stdout:${'x'.repeat(60)}`, `stderr:${'k'.repeat(10)}`]);
  });

  it('stops a stream whose kept output the budget refuses, and gives back what the file does not hold', async () => {
    const room = budget(3 * (LOG_HEADER_BYTES + 10));
    const { log } = output({ budget: room });
    expect(log.append('stdout', Buffer.alloc(10, 'a'), true)).toBe(true);
    expect(log.append('stdout', Buffer.alloc(100, 'b'), true)).toBe(false);
    // The stream's kept output ends there: nothing more of it is logged, kept or not.
    expect(log.append('stdout', Buffer.alloc(1, 'c'), true)).toBe(false);
    expect(log.append('stderr', Buffer.alloc(10, 'd'), true)).toBe(true);
    const { bytes } = await log.close();
    expect(bytes).toBe(2 * (LOG_HEADER_BYTES + 10));
    expect(room.held).toBe(bytes);
  });

  it('asks the producer to pause while its output waits for the disk, and to go on once written', async () => {
    const pressure: boolean[] = [];
    const path = join(dir, `${next++}.output`);
    let release: () => void = () => undefined;
    const dirReady = new Promise<void>((resolve) => (release = resolve));
    const log = new ProcessOutput({ path, ensureDir: () => dirReady, onPressure: (high) => pressure.push(high) });
    for (let i = 0; i < 20; i++) log.append('stdout', Buffer.alloc(64 * 1024, 'z'), true);
    expect(pressure).toEqual([true]);
    release();
    await log.flush();
    expect(pressure).toEqual([true, false]);
    await log.close();
  });
});
