// The DETAIL of a stale-token refusal, written by the SQL functions (definitions.ts) and read back
// by the SQL endpoint to log the rejection: one format, produced and parsed here.
//   fence key "<fence key as JSON>", token <token>, highest token <highest, or nothing>
// The forgery guard's refusals put `unverified token: ` in front: they are not stale rejections.
// fencepost/writer's fenceRefusal reads both on the writer's side (src/writer/fence-refusal.ts).

/** SQL: the stale DETAIL for these expressions (a text, a bigint, a bigint that may be null). */
export function staleDetailSql(fenceKey: string, token: string, highest: string): string {
  return `format('fence key %s, token %s, highest token %s', to_json(${fenceKey}), ${token}, ${highest})`;
}

const UNVERIFIED = 'unverified token: ';

/** SQL: the forgery guard's DETAIL for the same three values. */
export function unverifiedDetailSql(fenceKey: string, token: string, highest: string): string {
  return `format('${UNVERIFIED}fence key %s, token %s, highest token %s', to_json(${fenceKey}), ${token}, ${highest})`;
}

/** The forgery guard's DETAIL, written by the proxy itself. */
export function unverifiedDetailText(fenceKey: string, token: bigint, highest: bigint | null): string {
  return UNVERIFIED + staleDetailText(fenceKey, token, highest);
}

/** The stale DETAIL, written by the proxy itself (to_json of a string is JSON.stringify's text for the keys fences take). */
export function staleDetailText(fenceKey: string, token: bigint, highest: bigint | null): string {
  return `fence key ${JSON.stringify(fenceKey)}, token ${token}, highest token ${highest ?? ''}`;
}

const STALE = /^fence key ("(?:[^"\\]|\\.)*"), token (\d+), highest token (\d*)$/;

/** The fence key, token and highest token of a stale DETAIL; null for any other text. */
export function parseStaleDetail(detail: string | undefined): { fenceKey: string; token: bigint; highestToken: bigint | null } | null {
  const m = STALE.exec(detail ?? '');
  if (!m) return null;
  return { fenceKey: JSON.parse(m[1]!) as string, token: BigInt(m[2]!), highestToken: m[3] ? BigInt(m[3]) : null };
}
