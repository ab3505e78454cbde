// What a writer of the SQL endpoint hears when the fence refuses its connection: the fence decides
// (src/fence/session-fence.ts, Fence.enterSession) and hands its refusal over as data; here it is
// worded as the ErrorResponse the driver shows with its SQLSTATE. Each refusal's fields come from
// the refusal itself, never from another message's text.
import {
  GUARD_UNAVAILABLE,
  INVALID_FENCE_SETTING,
  RAISE_FIRST,
  STALE_TOKEN,
  DURABILITY_UNSAFE,
  quoteBounded,
  type SessionRefusal,
  SQLSTATE,
} from '../../fence/index.ts';
import type { ErrorFields } from './wire/backend.ts';

/**
 * The DETAIL of a stale-token refusal, one fixed form for people and for writers' error handling:
 *   fence key "<fence key as JSON>", token <token>, highest token <highest, or nothing>
 * The forgery guard's refusals put `unverified token: ` in front: they are not stale rejections.
 */
export function staleDetailText(fenceKey: string, token: bigint, highest: bigint | null): string {
  return `fence key ${JSON.stringify(fenceKey)}, token ${token}, highest token ${highest ?? ''}`;
}

/** The forgery guard's DETAIL: the stale one behind `unverified token: ` (not a stale rejection). */
export function unverifiedDetailText(fenceKey: string, token: bigint, highest: bigint | null): string {
  return `unverified token: ${staleDetailText(fenceKey, token, highest)}`;
}

const refusal = (code: string, message: string, detail?: string, hint?: string): ErrorFields => ({
  severity: 'FATAL',
  code,
  message,
  ...(detail !== undefined ? { detail } : {}),
  ...(hint !== undefined ? { hint } : {}),
});

const RETRY_HINT = 'nothing was applied; connect again';

/** How the endpoint counts a refusal that is not a stale token: the fence could not be checked, or the settings are malformed. */
export function refusalOutcome(r: SessionRefusal): 'error' | 'invalid' | null {
  switch (r.reason) {
    case 'invalid_setting':
    case 'outside_prefixes':
      return 'invalid';
    case 'stale':
    case 'unverified':
      return null;
    default:
      return 'error';
  }
}

/** A refusal as the writer hears it at startup. */
export function refusalFields(r: SessionRefusal): ErrorFields {
  switch (r.reason) {
    case 'invalid_setting':
      return refusal(INVALID_FENCE_SETTING, r.message, undefined, r.hint);
    case 'outside_prefixes':
      return refusal(
        SQLSTATE.INSUFFICIENT_PRIVILEGE,
        `this key may not write fence key ${quoteBounded(r.fenceKey)}: it is outside its fence-key prefixes`,
      );
    case 'durability':
      return durabilityRefusal();
    case 'stale':
      return refusal(
        STALE_TOKEN,
        `stale fencing token: token ${r.token} is below the highest token ${r.highestToken} of fence key ${JSON.stringify(r.fenceKey)}`,
        staleDetailText(r.fenceKey, r.token, r.highestToken),
        "a newer leader holds this fence: this connection may not write; connect with the current leader's token",
      );
    case 'unverified':
      return refusal(
        STALE_TOKEN,
        `unverified fencing token: token ${r.token} would raise fence key ${JSON.stringify(r.fenceKey)} but is not the current leader's`,
        unverifiedDetailText(r.fenceKey, r.token, r.highestToken),
        "the forgery guard did not verify this token as the sequence of the current leader's election node; nothing was applied",
      );
    case 'guard_unavailable':
      return refusal(
        GUARD_UNAVAILABLE,
        `cannot verify fencing token ${r.token} of fence key ${JSON.stringify(r.fenceKey)}: ZooKeeper unreachable`,
        unverifiedDetailText(r.fenceKey, r.token, r.highestToken),
        "the forgery guard could not ask ZooKeeper whether this token is the current leader's; nothing was applied, connect again",
      );
    case 'not_raised':
      return refusal(
        RAISE_FIRST,
        `fence ${JSON.stringify(r.fenceKey)} could not be raised to token ${r.token}${r.raiseFailed ? '' : ' (raised meanwhile by another token?)'}`,
        undefined,
        RETRY_HINT,
      );
    case 'could_not_fence':
      // Its own SQLSTATE (55P03, 40001, 57014, …), which drivers' retry logic knows.
      return refusal(
        r.sqlState ?? RAISE_FIRST,
        `could not fence this connection at token ${r.token} of fence key ${JSON.stringify(r.fenceKey)}: ${r.message ?? 'no answer'}`,
        undefined,
        RETRY_HINT,
      );
  }
}

/** The refusal of every write while a failover could lose a fence raise. */
export function durabilityRefusal(): ErrorFields {
  return refusal(
    DURABILITY_UNSAFE,
    'writes are refused: no synchronous standby streams, and FENCEPOST_REQUIRE_SYNC_STANDBY is set',
    undefined,
    'a failover now could lose a fence raise; nothing was applied; connect again once a synchronous standby streams',
  );
}

/** What a writer whose connection a newer leader's raise ended hears, as its next answer. */
export function revokedFields(fenceKey: string, token: bigint, highest: bigint): ErrorFields {
  return refusal(
    STALE_TOKEN,
    `stale fencing token: a newer leader raised fence key ${JSON.stringify(fenceKey)} to token ${highest}, above this connection's token ${token}`,
    staleDetailText(fenceKey, token, highest),
    "the raise ended this connection: what its open transaction did was not applied; reconnect with the new leader's token",
  );
}
