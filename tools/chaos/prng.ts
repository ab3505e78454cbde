// A small seeded PRNG (mulberry32): the same seed gives the same sequence on every machine, so a
// chaos run's fault schedule can be replayed from its seed alone.

export const MAX_SEED = 0xffff_ffff;

export class Prng {
  private state: number;

  /** `seed`: a whole number in 0…2^32−1 (the state is 32 bits: a larger seed would alias a smaller one). */
  constructor(seed: number) {
    if (!Number.isInteger(seed) || seed < 0 || seed > MAX_SEED)
      throw new RangeError(`seed must be a whole number in 0…${MAX_SEED}, got ${seed}`);
    this.state = seed;
  }

  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** Integer in [min, max] (both inclusive). */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('pick from an empty list');
    return items[Math.floor(this.next() * items.length)]!;
  }

  /** A shuffled copy (Fisher–Yates). */
  shuffle<T>(items: readonly T[]): T[] {
    const out = [...items];
    for (let i = out.length - 1; i > 0; i--) {
      const j = Math.floor(this.next() * (i + 1));
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }
}
