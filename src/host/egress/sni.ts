/** What the first bytes of a TLS connection say about where it is going. */
export type ClientHelloResult =
  | { kind: 'incomplete' }
  | { kind: 'not-tls' }
  | { kind: 'hello'; serverName: string | undefined };

const MAX_RECORD_BYTES = 16_384 + 2048;

/**
 * Reads the server name (SNI) from a TLS ClientHello without terminating TLS. Only the first
 * record is read: clients put the whole ClientHello in it (it is far below the record size).
 */
export function parseClientHello(data: Buffer): ClientHelloResult {
  if (data.length > 0 && data[0] !== 0x16) return { kind: 'not-tls' };
  if (data.length > 1 && data[1] !== 0x03) return { kind: 'not-tls' };
  if (data.length < 5) return { kind: 'incomplete' };
  const recordLength = data.readUInt16BE(3);
  if (recordLength > MAX_RECORD_BYTES) return { kind: 'not-tls' };
  if (data.length < 5 + recordLength) return { kind: 'incomplete' };
  const hello = data.subarray(5, 5 + recordLength);
  try {
    if (hello[0] !== 0x01) return { kind: 'not-tls' };
    let offset = 4 + 2 + 32; // handshake header, client_version, random
    offset += 1 + read8(hello, offset); // session id
    offset += 2 + hello.readUInt16BE(offset); // cipher suites
    offset += 1 + read8(hello, offset); // compression methods
    if (offset >= hello.length) return { kind: 'hello', serverName: undefined };
    const end = Math.min(hello.length, offset + 2 + hello.readUInt16BE(offset));
    offset += 2;
    while (offset + 4 <= end) {
      const type = hello.readUInt16BE(offset);
      const length = hello.readUInt16BE(offset + 2);
      offset += 4;
      if (type === 0 && length >= 5) {
        const nameType = read8(hello, offset + 2);
        const nameLength = hello.readUInt16BE(offset + 3);
        if (nameType === 0 && offset + 5 + nameLength <= end) {
          const name = hello.toString('latin1', offset + 5, offset + 5 + nameLength).toLowerCase();
          return { kind: 'hello', serverName: /^[a-z0-9.-]+$/.test(name) ? name : undefined };
        }
      }
      offset += length;
    }
    return { kind: 'hello', serverName: undefined };
  } catch {
    return { kind: 'not-tls' }; // a read past the end: a malformed hello
  }
}

function read8(buffer: Buffer, offset: number): number {
  const value = buffer[offset];
  if (value === undefined) throw new RangeError('short ClientHello');
  return value;
}
