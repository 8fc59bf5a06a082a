/** Keeps the first `capBytes` of a stream and counts the rest, so truncation is never silent. */
export class OutputBuffer {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  total = 0;

  constructor(private readonly capBytes: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    const room = this.capBytes - this.kept;
    if (room <= 0) return;
    const part = chunk.length <= room ? chunk : chunk.subarray(0, room);
    this.chunks.push(part);
    this.kept += part.length;
  }

  get truncated(): boolean {
    return this.total > this.kept;
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}
