export { InterpreterService } from './service.js';
export { runCodeOnce, type RunCodeOnceOptions, type RunCodeOnceResult } from './run-once.js';
export * from './types.js';
