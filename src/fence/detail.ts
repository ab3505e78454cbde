// The DETAIL of a stale-token refusal, written by the SQL functions (definitions.ts) and by the SQL
// endpoint (src/proxy/sql/fencer.ts): one format, for people and for writers' error handling. The
// proxy itself never reads it back: a refusal's fields travel as data.
//   fence key "<fence key as JSON>", token <token>, highest token <highest, or nothing>
// The forgery guard's refusals put `unverified token: ` in front: they are not stale rejections.

/** SQL: the stale DETAIL for these expressions (a text, a bigint, a bigint that may be null). */
export function staleDetailSql(fenceKey: string, token: string, highest: string): string {
  return `format('fence key %s, token %s, highest token %s', to_json(${fenceKey}), ${token}, ${highest})`;
}

/** SQL: the forgery guard's DETAIL for the same three values. */
export function unverifiedDetailSql(fenceKey: string, token: string, highest: string): string {
  return `format('unverified token: fence key %s, token %s, highest token %s', to_json(${fenceKey}), ${token}, ${highest})`;
}

/** The stale DETAIL, written by the proxy itself (to_json of a string is JSON.stringify's text for the keys fences take). */
export function staleDetailText(fenceKey: string, token: bigint, highest: bigint | null): string {
  return `fence key ${JSON.stringify(fenceKey)}, token ${token}, highest token ${highest ?? ''}`;
}
