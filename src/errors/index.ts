export { ERROR_CODES, type ErrorCode } from './codes.js';
export { HTTP_STATUS } from './status.js';
export { SandboxError, isSandboxError, type ErrorBody, type SandboxErrorOptions } from './sandbox-error.js';
