export { LocalArtifactStore, chunkBytesFor, digestFile, isVerifyFailure, type Digest, type LocalArtifactStoreOptions } from './local-store.js';
export * from './types.js';
