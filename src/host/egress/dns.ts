import { createSocket, type Socket } from 'node:dgram';

/** One question of a DNS query, as far as the resolver cares. */
export interface DnsQuestion {
  id: number;
  /** Lower-case name without the trailing dot. */
  name: string;
  type: number;
  /** The question section as received, echoed in the answer. */
  section: Buffer;
  recursionDesired: boolean;
}

export const DNS_TYPE_A = 1;
const RCODE_NOERROR = 0;
const RCODE_FORMERR = 1;
export const RCODE_NXDOMAIN = 3;
/** Answers are only valid for a few seconds: a policy change applies to the next lookup. */
const ANSWER_TTL_S = 5;

/** Parses a query with exactly one question; undefined for anything else. */
export function parseDnsQuery(packet: Buffer): DnsQuestion | undefined {
  if (packet.length < 17) return undefined;
  const flags = packet.readUInt16BE(2);
  if ((flags & 0x8000) !== 0 || packet.readUInt16BE(4) !== 1) return undefined;
  const labels: string[] = [];
  let offset = 12;
  for (;;) {
    const length = packet[offset];
    if (length === undefined || length > 63) return undefined; // no compression in questions
    offset += 1;
    if (length === 0) break;
    if (offset + length > packet.length) return undefined;
    labels.push(packet.toString('latin1', offset, offset + length).toLowerCase());
    offset += length;
  }
  if (offset + 4 > packet.length) return undefined;
  return {
    id: packet.readUInt16BE(0),
    name: labels.join('.'),
    type: packet.readUInt16BE(offset),
    section: packet.subarray(12, offset + 4),
    recursionDesired: (flags & 0x0100) !== 0,
  };
}

/** An answer to `question`: A records for `addresses` (only for type A), or an error code. */
export function buildDnsAnswer(question: DnsQuestion, rcode: number, addresses: readonly string[]): Buffer {
  const answers = rcode === RCODE_NOERROR && question.type === DNS_TYPE_A ? addresses : [];
  const header = Buffer.alloc(12);
  header.writeUInt16BE(question.id, 0);
  header.writeUInt16BE(0x8000 | 0x0400 | (question.recursionDesired ? 0x0100 : 0) | 0x0080 | rcode, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(answers.length, 6);
  const records = answers.map((address) => {
    const record = Buffer.alloc(16);
    record.writeUInt16BE(0xc00c, 0); // pointer to the question's name
    record.writeUInt16BE(DNS_TYPE_A, 2);
    record.writeUInt16BE(1, 4);
    record.writeUInt32BE(ANSWER_TTL_S, 6);
    record.writeUInt16BE(4, 10);
    address.split('.').forEach((octet, index) => record.writeUInt8(Number(octet), 12 + index));
    return record;
  });
  return Buffer.concat([header, question.section, ...records]);
}

export interface DnsResponderOptions {
  address: string;
  port: number;
  /**
   * Decides a question from a sandbox address: the A records to answer with, or undefined for
   * NXDOMAIN. Nothing is ever forwarded to another resolver.
   */
  answer: (source: string, question: DnsQuestion) => readonly string[] | undefined;
}

/** The sandboxes' only resolver: answers from policy, never recursing (no exfiltration by name). */
export class DnsResponder {
  private readonly socket: Socket;
  private readonly options: DnsResponderOptions;
  private bound = false;

  constructor(options: DnsResponderOptions) {
    this.options = options;
    this.socket = createSocket({ type: 'udp4' });
    this.socket.on('message', (packet, remote) => this.onMessage(packet, remote.address, remote.port));
  }

  /** Binds and returns the port in use. */
  async start(): Promise<number> {
    await new Promise<void>((resolve, reject) => {
      this.socket.once('error', reject);
      this.socket.bind({ address: this.options.address, port: this.options.port, exclusive: true }, () => {
        this.socket.off('error', reject);
        resolve();
      });
    });
    this.socket.on('error', () => undefined); // a send to a vanished sandbox is not our failure
    this.socket.unref();
    this.bound = true;
    return this.socket.address().port;
  }

  close(): Promise<void> {
    if (!this.bound) return Promise.resolve();
    this.bound = false;
    return new Promise((resolve) => this.socket.close(() => resolve()));
  }

  private onMessage(packet: Buffer, source: string, port: number): void {
    const question = parseDnsQuery(packet);
    let reply: Buffer;
    if (!question) {
      if (packet.length < 12) return;
      reply = Buffer.from(packet.subarray(0, 12));
      reply.writeUInt16BE(0x8000 | RCODE_FORMERR, 2);
      reply.fill(0, 4, 12);
    } else {
      const addresses = this.options.answer(source, question);
      reply = buildDnsAnswer(question, addresses ? RCODE_NOERROR : RCODE_NXDOMAIN, addresses ?? []);
    }
    this.socket.send(reply, port, source);
  }
}
