import { SandboxError } from '../errors/index.js';

const SIZE_UNITS: Record<string, number> = {
  '': 1, b: 1,
  k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9,
  ki: 1024, kib: 1024, mi: 1024 ** 2, mib: 1024 ** 2, gi: 1024 ** 3, gib: 1024 ** 3,
};

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, min: 60_000, h: 3_600_000 };

/** Parses "256MiB", "1g", "512k" or a plain number of bytes. */
export function parseBytes(text: string, field = 'size'): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = match?.[2]?.toLowerCase() ?? '';
  const factor = SIZE_UNITS[unit];
  if (!match?.[1] || factor === undefined) {
    throw new SandboxError('INVALID_ARGUMENT', `${field}: cannot read "${text}" as a size`, {
      details: { field, value: text },
      hint: 'Use a number of bytes or a unit: 512KiB, 256MiB, 1GiB (also k, m, g).',
    });
  }
  return Math.round(Number(match[1]) * factor);
}

/** Parses "10s", "250ms", "2m" or a plain number of milliseconds. */
export function parseDurationMs(text: string, field = 'duration'): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = match?.[2]?.toLowerCase() || 'ms';
  const factor = DURATION_UNITS[unit];
  if (!match?.[1] || factor === undefined) {
    throw new SandboxError('INVALID_ARGUMENT', `${field}: cannot read "${text}" as a duration`, {
      details: { field, value: text },
      hint: 'Use milliseconds or a unit: 250ms, 10s, 2m, 1h.',
    });
  }
  return Math.round(Number(match[1]) * factor);
}

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const shown = unit === 0 || Number.isInteger(value) ? String(value) : value.toFixed(1);
  return `${shown} ${units[unit]}`;
}

export function formatDurationMs(ms: number): string {
  if (ms < 1000) return `${ms} ms`;
  const seconds = ms / 1000;
  return Number.isInteger(seconds) ? `${seconds} s` : `${seconds.toFixed(1)} s`;
}
