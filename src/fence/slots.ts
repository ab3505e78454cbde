// The fairness of POST /v1/transactions (transaction.ts): slots shared by the keys.
/**
 * The transaction slots, shared by the keys: at most `perKey` of them held by one key, so a key
 * that floods the door never takes the slots every other key needs. Waiters are granted in order
 * of arrival, skipping those of a key already at its share.
 */
export class Slots {
  private free: number;
  private readonly held = new Map<string, number>();
  private readonly waiters: { key: string; grant: () => void }[] = [];
  constructor(
    n: number,
    private readonly perKey: number,
  ) {
    this.free = n;
  }
  async take(key: string, signal: AbortSignal): Promise<void> {
    if (signal.aborted) throw signal.reason;
    if (this.free > 0 && (this.held.get(key) ?? 0) < this.perKey) {
      this.grantTo(key);
      return;
    }
    await new Promise<void>((resolve, reject) => {
      const waiter = {
        key,
        grant: () => {
          signal.removeEventListener('abort', abort);
          resolve();
        },
      };
      const abort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
      };
      this.waiters.push(waiter);
      signal.addEventListener('abort', abort, { once: true });
    });
  }
  give(key: string): void {
    this.free++;
    const n = (this.held.get(key) ?? 1) - 1;
    if (n <= 0) this.held.delete(key);
    else this.held.set(key, n);
    const i = this.waiters.findIndex((w) => (this.held.get(w.key) ?? 0) < this.perKey);
    if (i < 0) return;
    const [w] = this.waiters.splice(i, 1);
    this.grantTo(w!.key);
    w!.grant();
  }
  private grantTo(key: string): void {
    this.free--;
    this.held.set(key, (this.held.get(key) ?? 0) + 1);
  }
}
