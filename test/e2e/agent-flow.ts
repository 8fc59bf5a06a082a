/**
 * The task every agent surface must carry (MCP over both transports, each framework adapter):
 * create, write a script, run it, read what it wrote, fork, see the fork's changes, kill, with
 * the explicit kill flag and Capsule's error codes and hints reaching the model.
 */
import { expect } from 'vitest';

/** One tool call as a surface makes it: the answer, or the text the model would read. */
export type ToolCall = (name: string, args: Record<string, unknown>) => Promise<{ ok: true; data: Record<string, unknown> } | { ok: false; text: string }>;

const SCRIPT = 'open("out.txt", "w").write(str(6 * 7))\nprint("done")\n';

async function ok(call: ToolCall, name: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
  const outcome = await call(name, args);
  if (!outcome.ok) throw new Error(`${name} failed: ${outcome.text}`);
  return outcome.data;
}

async function failed(call: ToolCall, name: string, args: Record<string, unknown>): Promise<string> {
  const outcome = await call(name, args);
  if (outcome.ok) throw new Error(`${name} should have failed, answered ${JSON.stringify(outcome.data)}`);
  return outcome.text;
}

/** Runs the flow; every sandbox it made is killed before it returns. Returns the two sandbox ids. */
export async function agentFlow(call: ToolCall, createArgs: Record<string, unknown> = { template: 'host' }): Promise<{ sandboxId: string; forkId: string }> {
  // A template that does not exist: Capsule's code and hint, and nothing made.
  expect(await failed(call, 'create_sandbox', { template: 'no-such-template' })).toMatch(/TEMPLATE_NOT_FOUND: [^\n]+\nHint: /);
  const created = await ok(call, 'create_sandbox', { ...createArgs, limits: { wallClockMs: 30_000 } });
  const sandboxId = String(created.sandboxId);
  expect(sandboxId).toMatch(/^[a-z2-7]{20}$/);
  expect(created.state).toBe('running');
  const made = [sandboxId];
  const snapshots: unknown[] = [];
  try {
    expect(await ok(call, 'write_file', { sandboxId, path: 'job.py', content: SCRIPT })).toMatchObject({ path: '/workspace/job.py' });
    expect(await ok(call, 'exec', { sandboxId, command: 'python3 job.py' })).toMatchObject({ outcome: 'ok', exitCode: 0, stdout: 'done\n', stdoutTruncated: false });
    expect(await ok(call, 'read_file', { sandboxId, path: 'out.txt' })).toMatchObject({ content: '42', truncated: false });
    const listed = (await ok(call, 'list_files', { sandboxId })).entries as { path: string }[];
    expect(listed.map((entry) => entry.path)).toEqual(expect.arrayContaining(['/workspace/job.py', '/workspace/out.txt']));
    expect((await ok(call, 'run_code', { sandboxId, code: 'x = 20\nx + 22' })).results).toEqual([{ text: '42' }]);

    // A fork starts with the files, then goes its own way.
    const forked = await ok(call, 'fork_sandbox', { sandboxId, count: 1 });
    snapshots.push(forked.snapshotId);
    expect(String(forked.snapshotId)).toMatch(/^snap_/);
    const forks = forked.forks as { sandboxId?: string; error?: unknown }[];
    expect(forks).toHaveLength(1);
    const forkId = String(forks[0]?.sandboxId);
    made.push(forkId);
    expect(forkId).not.toBe(sandboxId);
    expect(await ok(call, 'read_file', { sandboxId: forkId, path: 'out.txt' })).toMatchObject({ content: '42' });
    await ok(call, 'exec', { sandboxId: forkId, command: ['python3', '-c', 'open("fork.txt", "w").write("only here")'] });
    const changes = await ok(call, 'sandbox_changes', { sandboxId: forkId });
    expect(changes.origin).toMatchObject({ snapshotId: forked.snapshotId });
    expect(changes.changes).toEqual([expect.objectContaining({ path: '/workspace/fork.txt', kind: 'added', type: 'file' })]);
    expect(await failed(call, 'read_file', { sandboxId, path: 'fork.txt' })).toMatch(/FILE_NOT_FOUND/);

    // Capsule's code and hint reach the model; killing needs the explicit flag.
    expect(await failed(call, 'exec', { sandboxId: 'aaaaaaaaaaaaaaaaaaaa', command: 'true' })).toMatch(/^[^]*SANDBOX_NOT_FOUND: [^\n]+\nHint: /);
    expect(await failed(call, 'kill_sandbox', { sandboxId: forkId })).toMatch(/confirm/);
    expect(await ok(call, 'exec', { sandboxId: forkId, command: 'true' })).toMatchObject({ exitCode: 0 });
    for (const id of [forkId, sandboxId]) expect(await ok(call, 'kill_sandbox', { sandboxId: id, confirm: true })).toMatchObject({ sandboxId: id, state: 'killed' });
    // The fork's snapshot outlives both sandboxes until it is deleted, with the flag too.
    expect(await failed(call, 'delete_snapshot', { snapshotId: forked.snapshotId })).toMatch(/confirm/);
    expect(await ok(call, 'delete_snapshot', { snapshotId: forked.snapshotId, confirm: true })).toMatchObject({ deleted: true });
    snapshots.length = 0;
    return { sandboxId, forkId };
  } finally {
    // Whatever failed above, nothing outlives the test (a second kill is an error, ignored).
    for (const id of made) await call('kill_sandbox', { sandboxId: id, confirm: true }).catch(() => undefined);
    for (const snapshotId of snapshots) await call('delete_snapshot', { snapshotId, confirm: true }).catch(() => undefined);
  }
}
