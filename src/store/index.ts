export { atomically, openDatabase, DATABASE_FILE, type SqliteDatabase } from './database.js';
export { SqliteSandboxRecords, type SandboxPageQuery } from './sandbox-records.js';
export { MemoryRecordStore, type SandboxRecordStore, type UnreadableRecord } from './record-store.js';
export { ApiKeyStore, API_KEY_PATTERN, TENANT_ID_PATTERN, DEFAULT_TENANT, newApiKey, type ApiKeyRecord, type KeyGrants, type MintedKey } from './api-keys.js';
export { OperationStore, OPERATION_TTL_MS, type OperationRecord, type StoredResponse } from './operations.js';
export { AuditLog, verifyAuditChain, recordHash, sha256Hex, GENESIS_HASH, type AuditEntry, type AuditRecord, type VerifyResult } from './audit-log.js';
export { canonicalJson } from './canonical-json.js';
export { MemorySnapshotRecords, SqliteSnapshotRecords, type SnapshotRecordStore } from './snapshot-records.js';
export { MemoryVolumeRecords, SqliteVolumeRecords, type VolumeRecordStore } from './volume-records.js';
