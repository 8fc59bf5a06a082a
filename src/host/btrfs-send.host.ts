import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { SandboxError } from '../errors/index.js';

const STDERR_KEEP = 4096;
/** Listing what changed between two trees is metadata work; a hung one must not hang a call. */
const SEND_TIMEOUT_MS = 120_000;

/**
 * Streams the operations that turn `origin` into `snapshot` (both read-only subvolumes on one
 * btrfs filesystem) to `onLine`: `btrfs send --no-data -p ORIGIN SNAPSHOT | btrfs receive --dump`,
 * two argv-spawned processes joined by a pipe. With no origin, every path of `snapshot` is listed
 * (a full send). The work is proportional to what changed, not to the size of the trees.
 */
export async function streamSendDump(origin: string | undefined, snapshot: string, onLine: (line: string) => void): Promise<void> {
  const send = spawn('btrfs', ['send', '--no-data', '-q', ...(origin !== undefined ? ['-p', origin] : []), snapshot], {
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: SEND_TIMEOUT_MS,
    killSignal: 'SIGKILL',
  });
  const receive = spawn('btrfs', ['receive', '--dump'], { stdio: ['pipe', 'pipe', 'pipe'], timeout: SEND_TIMEOUT_MS, killSignal: 'SIGKILL' });
  send.stdout.pipe(receive.stdin);
  // A receive that stops reading must not leave send blocked forever, nor an EPIPE unhandled.
  receive.stdin.on('error', () => send.kill('SIGKILL'));
  let sendErr = '';
  let receiveErr = '';
  send.stderr.on('data', (chunk: Buffer) => (sendErr = (sendErr + chunk.toString()).slice(-STDERR_KEEP)));
  receive.stderr.on('data', (chunk: Buffer) => (receiveErr = (receiveErr + chunk.toString()).slice(-STDERR_KEEP)));
  const exited = (child: ChildProcess) =>
    new Promise<number | null>((resolve, reject) => {
      child.once('error', (error) => reject(new SandboxError('HOST_NOT_READY', `cannot run btrfs: ${error.message}`, { cause: error, hint: 'Install btrfs-progs (scripts/setup.sh).' })));
      child.once('close', (code) => resolve(code));
    });
  const sendDone = exited(send);
  const receiveDone = exited(receive);
  const lines = createInterface({ input: receive.stdout, crlfDelay: Infinity });
  let failure: Error | undefined;
  lines.on('line', (line) => {
    if (failure !== undefined) return;
    try {
      onLine(line);
    } catch (error) {
      failure = error instanceof Error ? error : new Error(String(error));
      send.kill('SIGKILL');
      receive.kill('SIGKILL');
    }
  });
  const [sendCode, receiveCode] = await Promise.all([sendDone, receiveDone]);
  if (failure !== undefined) throw failure;
  if (sendCode !== 0 || receiveCode !== 0) {
    const why = (sendErr.trim() || receiveErr.trim() || `exit ${sendCode}/${receiveCode}`).split('\n').slice(-3).join('; ');
    throw new SandboxError('INTERNAL', `listing the changes of ${snapshot} failed: ${why}`, {
      details: { sendExit: sendCode, receiveExit: receiveCode },
    });
  }
}
