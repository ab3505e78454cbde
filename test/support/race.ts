// A race of concurrent writers with mixed tokens on one fence key, recorded for checking.
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';

export interface RaceRecord {
  writer: number;
  url: string;
  objectKey: string;
  token: bigint;
  body: string;
  sentAt: number;
  ackedAt: number;
  status: number;
  version: number | null;
}

export interface RaceOptions {
  urls: string[];
  fenceKey: string;
  objectKeys: string[];
  writers: number;
  writesPerWriter: number;
  /** How far behind the current token a write may be: 0…maxLag (default 2). */
  maxLag?: number;
}

/**
 * Writers share a "current" token that rises every few writes; each write uses the current token
 * or one a little behind it, so some writes are stale when they arrive.
 */
export async function runRace(opts: RaceOptions): Promise<RaceRecord[]> {
  const records: RaceRecord[] = [];
  let current = 1_000n;
  let issued = 0;
  const writer = async (w: number) => {
    for (let i = 0; i < opts.writesPerWriter; i++) {
      if (++issued % 7 === 0) current += 1n;
      const lag = BigInt(Math.floor(Math.random() * ((opts.maxLag ?? 2) + 1))); // 0…maxLag behind
      const token = current - lag;
      const objectKey = opts.objectKeys[(w + i) % opts.objectKeys.length]!;
      const body = `${w}:${i}:${randomUUID()}`;
      const url = opts.urls[(w + i) % opts.urls.length]!;
      const sentAt = performance.now();
      const res = await fetch(`${url}/v1/objects/${encodeURIComponent(objectKey)}`, {
        method: 'PUT',
        headers: { 'fencing-token': token.toString(), 'fence-key': opts.fenceKey, 'content-type': 'text/plain', 'writer-id': `w${w}` },
        body,
      });
      const json = (await res.json()) as { version?: number };
      records.push({
        writer: w,
        url,
        objectKey,
        token,
        body,
        sentAt,
        ackedAt: performance.now(),
        status: res.status,
        version: res.status === 200 ? (json.version ?? null) : null,
      });
    }
  };
  await Promise.all(Array.from({ length: opts.writers }, (_, w) => writer(w)));
  return records;
}

/**
 * Checks the history. Returns a list of violations (empty = all invariants hold):
 * - every response is 200 or 409;
 * - every accepted write's token ≥ every token acknowledged (200) before it was sent;
 * - per object, accepted writes ordered by version have versions 1..n and non-decreasing tokens.
 */
export function checkRace(records: RaceRecord[]): string[] {
  const violations: string[] = [];
  const accepted = records.filter((r) => r.status === 200);
  for (const r of records) if (r.status !== 200 && r.status !== 409) violations.push(`unexpected status ${r.status}`);
  const byAck = [...accepted].sort((a, b) => a.ackedAt - b.ackedAt);
  for (const w of accepted) {
    for (const a of byAck) {
      if (a.ackedAt >= w.sentAt) break;
      if (w.token < a.token) violations.push(`write ${w.body} with token ${w.token} accepted after token ${a.token} was acknowledged`);
    }
  }
  const perObject = new Map<string, RaceRecord[]>();
  for (const r of accepted) perObject.set(r.objectKey, [...(perObject.get(r.objectKey) ?? []), r]);
  for (const [key, list] of perObject) {
    list.sort((a, b) => (a.version ?? 0) - (b.version ?? 0));
    list.forEach((r, i) => {
      if (r.version !== i + 1) violations.push(`${key}: version ${r.version} at position ${i + 1}`);
      const prev = list[i - 1];
      if (prev && r.token < prev.token) violations.push(`${key}: token went back from ${prev.token} to ${r.token} at version ${r.version}`);
    });
  }
  return violations;
}
