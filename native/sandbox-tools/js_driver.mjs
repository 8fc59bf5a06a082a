// Capsule's JavaScript interpreter driver: one persistent REPL context, driven over NDJSON.
//
// Runs inside the sandbox, started by the host through the agent (a small python3 parent puts it
// in its own process group, see src/engine/interpreter/driver.ts) as
//   node /.capsule/js_driver.mjs --context ID   with fd 3 = the agent's stdout, fds 1, 2 = its stderr
// so that the protocol owns fd 3 and anything written to fd 1 or 2 by code we do not control (a
// child process with inherited stdio) arrives on the agent's stderr.
//
//   stdin  (host -> driver): {"id", "op": "execute", "code", "envVars"?}, {"op": "interrupt", "id"?},
//                            {"op": "shutdown"}   ("restart" is done by the host: a new driver)
//   fd 3   (driver -> host): {"type": "ready"}, {"type": "fatal", "message"}, and per execution
//                            (with its "id"): stdout, stderr, result, error, executionCount, end.
//
// The evaluation is Node's own REPL evaluator (node:repl): declarations persist between calls,
// top-level await works, and the completion value of the code is its main result.
// Interrupts: SIGINT breaks synchronous code (breakEvalOnSigint); a pending await is abandoned.
import { writeSync } from 'node:fs';
import repl from 'node:repl';
import { PassThrough } from 'node:stream';
import { inspect, format } from 'node:util';

const PROTO_FD = 3;
const MAX_JSON_CHARS = 1_000_000;

function emit(event) {
  const data = Buffer.from(`${JSON.stringify(event)}\n`);
  let offset = 0;
  while (offset < data.length) offset += writeSync(PROTO_FD, data, offset);
}

function parseArgs(argv) {
  const args = { context: 'default' };
  for (let i = 0; i < argv.length; i += 2) {
    if (argv[i] === '--context' && argv[i + 1] !== undefined) args.context = argv[i + 1];
    else {
      emit({ type: 'fatal', message: `js_driver: unknown argument ${argv[i]}` });
      process.exit(2);
    }
  }
  return args;
}

parseArgs(process.argv.slice(2));

/** The execution output is attributed to; late async output goes to the last one. */
let currentId = null;
let lastId = null;
let executionCount = 0;
/** Set while an execution runs: settles it early (interrupt). */
let abandon = null;

function capture(name) {
  return (chunk, encoding, callback) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8');
    emit({ id: currentId ?? lastId, type: name, text });
    const done = typeof encoding === 'function' ? encoding : callback;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
}
process.stdout.write = capture('stdout');
process.stderr.write = capture('stderr');

const sink = new PassThrough();
sink.resume(); // the REPL's own prompt and echo are not wanted
const server = repl.start({
  input: new PassThrough(),
  output: sink,
  prompt: '',
  terminal: false,
  useGlobal: false,
  ignoreUndefined: true,
  breakEvalOnSigint: true,
  preview: false,
});
// console.* in the context writes through process.stdout/stderr, captured above.
Object.defineProperty(server.context, 'console', { value: console, writable: true, configurable: true });
server.on('exit', () => undefined); // `.exit` is never typed here; the host ends the driver

// SIGINT breaks synchronous code (the REPL's breakOnSigint watchdog); the host sends it only
// while the driver does not answer. Outside the code it must not end the driver, so a listener
// ignores it; while the REPL runs code the listener is removed (with one present, the watchdog
// lets the signal end the process). A pending await is abandoned by the interrupt request.
const onSigint = () => undefined;
process.on('SIGINT', onSigint);
// The REPL runs its evaluator inside a domain and sends thrown errors (sync or from the awaited
// promise) to the domain instead of the callback: take them from there first.
server._domain.prependListener('error', (error) => {
  if (abandon !== null) abandon({ error });
  else emit({ id: lastId, type: 'stderr', text: `Uncaught ${format(error)}\n` });
});

function interrupted() {
  const error = new Error('Script execution was interrupted (timeout or interrupt request)');
  error.name = 'Interrupted';
  error.stack = `${error.name}: ${error.message}`;
  return { error };
}

function evaluate(code, id) {
  return new Promise((resolve) => {
    abandon = resolve;
    process.off('SIGINT', onSigint);
    try {
      server.eval(code, server.context, `cell-${id}`, (error, value) => resolve({ error, value }));
    } catch (error) {
      resolve({ error });
    } finally {
      process.on('SIGINT', onSigint);
    }
  });
}

function describeError(error) {
  if (error instanceof repl.Recoverable) error = error.err; // incomplete input is a syntax error here
  if (error?.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') error = interrupted().error; // SIGINT broke sync code
  if (error !== null && typeof error === 'object' && 'message' in error) {
    const name = String(error.name ?? 'Error');
    return { name, value: String(error.message), traceback: userFrames(String(error.stack ?? `${name}: ${error.message}`)) };
  }
  return { name: 'Error', value: `Uncaught ${inspect(error)}`, traceback: `Uncaught ${inspect(error)}` };
}

/** The stack without the REPL's and vm's own frames below the user's code. */
function userFrames(stack) {
  const lines = stack.split('\n');
  const internal = lines.findIndex((line) => /\((node:|internal\/)|at (node:|REPLServer|Script\.runIn)/.test(line));
  return (internal > 0 ? lines.slice(0, internal) : lines).join('\n');
}

function isPlainJson(value) {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return true;
  if (typeof value === 'number') return Number.isFinite(value);
  if (typeof value !== 'object') return false;
  const proto = Object.getPrototypeOf(value);
  const plain = Array.isArray(value) || proto === null || proto?.constructor?.name === 'Object';
  if (!plain) return false;
  try {
    const text = JSON.stringify(value);
    return text !== undefined && text.length <= MAX_JSON_CHARS && JSON.stringify(JSON.parse(text)) === text;
  } catch {
    return false;
  }
}

function resultOf(value) {
  const result = { type: 'result', isMainResult: true, text: inspect(value, { depth: 4, maxArrayLength: 200 }) };
  if (isPlainJson(value)) result.json = value;
  return result;
}

async function execute({ id, code, envVars }) {
  currentId = id;
  lastId = id;
  executionCount += 1;
  emit({ id, type: 'executionCount', count: executionCount });
  const saved = {};
  for (const [key, value] of Object.entries(envVars ?? {})) {
    saved[key] = Object.hasOwn(process.env, key) ? process.env[key] : undefined;
    process.env[key] = value;
  }
  let outcome = 'idle';
  try {
    const { error, value } = await evaluate(String(code ?? ''), id);
    if (error !== null && error !== undefined) {
      emit({ id, type: 'error', ...describeError(error) });
      if (describeError(error).name === 'Interrupted') outcome = 'interrupted';
    } else if (value !== undefined) {
      emit({ id, ...resultOf(value) });
    }
  } catch (error) {
    emit({ id, type: 'error', ...describeError(error) });
  } finally {
    abandon = null;
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
    currentId = null;
    emit({ id, type: 'end', outcome });
  }
}

// Requests run one at a time, in order; an interrupt acts on the running one at once.
const queue = [];
let running = false;
async function pump() {
  if (running) return;
  running = true;
  while (queue.length > 0) {
    await execute(queue.shift());
  }
  running = false;
}

let inbox = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  inbox += chunk;
  let newline;
  while ((newline = inbox.indexOf('\n')) >= 0) {
    const line = inbox.slice(0, newline).trim();
    inbox = inbox.slice(newline + 1);
    if (line === '') continue;
    let request;
    try {
      request = JSON.parse(line);
    } catch (error) {
      emit({ type: 'fatal', message: `bad request line: ${error.message}` });
      continue;
    }
    if (request.op === 'interrupt') {
      // A late request for an execution that already ended must not end the next one.
      if (request.id === undefined || request.id === currentId) abandon?.(interrupted());
    }
    else if (request.op === 'shutdown') process.exit(0); // at once, even while code awaits
    else if (request.op === 'execute') queue.push(request);
    else emit({ type: 'fatal', message: `unknown op ${JSON.stringify(request.op)}` });
  }
  void pump();
});
process.stdin.on('end', () => process.exit(0));
process.on('uncaughtException', (error) => {
  // An error thrown later by a callback of user code: report it where output goes, keep running.
  emit({ id: currentId ?? lastId, type: 'stderr', text: `Uncaught ${format(error)}\n` });
});
process.on('unhandledRejection', (reason) => {
  emit({ id: currentId ?? lastId, type: 'stderr', text: `Unhandled rejection: ${format(reason)}\n` });
});
emit({ type: 'ready' });
