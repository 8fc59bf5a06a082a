import { createHash } from 'node:crypto';

/**
 * Sandboxes from templates get a range of RANGE_SIZE host uids each (their 0..65535 inside), in
 * slots from RANGE_BASE up: above the namespace and gVisor backends' single uids (3,000,000 and
 * 4,000,000 + 1,000,000 each), below 2^31, clear of /etc/subuid's usual 100000.. ranges.
 */
export const RANGE_BASE = 0x1000_0000;
export const RANGE_SIZE = 65_536;
const RANGE_SLOTS = 16_000;

/**
 * The uid ranges of one host's live sandboxes, shared by every backend on it, so that no two
 * live sandboxes ever share a host uid. A slot is derived from the sandbox id (a collision moves
 * to the next free one); the files of a sandbox from a template keep the template's raw ids on
 * disk (an idmapped mount shows them), so a recovered sandbox needs no particular slot.
 */
export class UidRanges {
  private readonly inUse = new Map<string, number>();
  private readonly taken = new Set<number>();

  /** The first host uid of the sandbox's range (the same one while it holds it). */
  allocate(sandboxId: string): number {
    const held = this.inUse.get(sandboxId);
    if (held !== undefined) return held;
    let slot = createHash('sha256').update(`range:${sandboxId}`).digest().readUInt32BE(0) % RANGE_SLOTS;
    for (let tries = 0; this.taken.has(slot); tries++) {
      if (tries >= RANGE_SLOTS) throw new Error('every uid range is in use');
      slot = (slot + 1) % RANGE_SLOTS;
    }
    this.taken.add(slot);
    const base = RANGE_BASE + slot * RANGE_SIZE;
    this.inUse.set(sandboxId, base);
    return base;
  }

  /**
   * Holds the range starting at `base` for the sandbox, as a running sandbox taken over after a
   * restart has it; false when `base` is not a range's start or another sandbox holds it.
   */
  claim(sandboxId: string, base: number): boolean {
    const held = this.inUse.get(sandboxId);
    if (held !== undefined) return held === base;
    const slot = (base - RANGE_BASE) / RANGE_SIZE;
    if (!Number.isInteger(slot) || slot < 0 || slot >= RANGE_SLOTS || this.taken.has(slot)) return false;
    this.taken.add(slot);
    this.inUse.set(sandboxId, base);
    return true;
  }

  release(sandboxId: string): void {
    const base = this.inUse.get(sandboxId);
    if (base === undefined) return;
    this.inUse.delete(sandboxId);
    this.taken.delete((base - RANGE_BASE) / RANGE_SIZE);
  }
}
