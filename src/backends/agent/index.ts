export {
  AgentClient,
  type AgentClientOptions,
  type AgentHandOver,
  type AgentProcessRecord,
  type AgentExit,
  type AgentProcess,
  type AgentStartOptions,
} from './agent-client.js';
export { AgentRelay, RELAY_CONNECT_TIMEOUT_MS } from './relay.js';
export {
  FrameDecoder,
  FrameType,
  HEADER_BYTES,
  MAX_PAYLOAD_BYTES,
  encodeFrame,
  type Frame,
} from './protocol.js';
