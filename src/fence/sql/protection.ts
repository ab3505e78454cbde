// The statements of protected data (protect.ts): declaring and forgetting protected tables and
// prefixes, and reading what is protected and enforced.
import pg from 'pg';
import type { Query } from './query.ts';

/** The table and every descendant (partitions, inheritance children), as regclass text. */
export const family = (table: string): Query => ({
  text: `WITH RECURSIVE family(oid) AS (
           SELECT c.oid FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1) AND c.relkind IN ('r', 'p')
           UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN family f ON i.inhparent = f.oid)
         SELECT c.oid::int8::text AS oid, c.oid::regclass::text AS name, pg_catalog.pg_get_userbyid(c.relowner) AS owner, n.nspname
         FROM family f JOIN pg_catalog.pg_class c ON c.oid = f.oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         ORDER BY c.oid = pg_catalog.to_regclass($1) DESC, c.oid`,
  values: [table],
});
export const relkind = (table: string): Query => ({
  text: 'SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1)',
  values: [table],
});
export const declareTable = (oid: string, fenceKey: string): Query => ({
  text: `INSERT INTO fencepost.protected_tables (relation, fence_key) VALUES ($1::int8::oid, $2)
         ON CONFLICT (relation) DO UPDATE SET fence_key = EXCLUDED.fence_key, declared_at = now()`,
  values: [oid, fenceKey],
});
export const forgetTable = (oid: string): Query => ({
  text: 'DELETE FROM fencepost.protected_tables WHERE relation = $1::int8::oid',
  values: [oid],
});
export const declarePrefix = (prefix: string, fenceKey: string): Query => ({
  text: `INSERT INTO fencepost.protected_prefixes (prefix, fence_key) VALUES ($1, $2)
         ON CONFLICT (prefix) DO UPDATE SET fence_key = EXCLUDED.fence_key, declared_at = now()`,
  values: [prefix, fenceKey],
});
export const forgetPrefix = (prefix: string): Query => ({
  text: 'DELETE FROM fencepost.protected_prefixes WHERE prefix = $1',
  values: [prefix],
});
export const anyPrefix = (): Query => ({ text: 'SELECT 1 FROM fencepost.protected_prefixes LIMIT 1' });
export const list = (): Query => ({
  text: 'SELECT kind, target, fence_key, enforced, why_not FROM fencepost.protected_data ORDER BY kind, target',
});
export const prefixes = (): Query => ({ text: 'SELECT prefix, fence_key FROM fencepost.protected_prefixes' });
export const installed = (): Query => ({ text: "SELECT pg_catalog.to_regclass('fencepost.protected_data') IS NOT NULL AS installed" });
/**
 * Each protected table with the roles besides its owner (superusers aside) granted USAGE on its
 * schema, PUBLIC included: each of them can name the table.
 */
export const schemaUsers = (): Query => ({
  text: `SELECT c.oid::regclass::text AS target, n.nspname AS schema,
           array(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
                 FROM pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a
                 WHERE a.privilege_type = 'USAGE' AND a.grantee <> c.relowner
                   AND (a.grantee = 0 OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = a.grantee))
                 ORDER BY 1) AS roles
         FROM fencepost.protected_tables t
         JOIN pg_catalog.pg_class c ON c.oid = t.relation
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         ORDER BY 1`,
});
/**
 * What the raise needs to end older-token connections (definitions.ts revoke_older_sessions runs as
 * its owner): to read every backend's start and transaction start (superuser or pg_read_all_stats)
 * and to terminate them (superuser or pg_signal_backend); and what it cannot end: prepared
 * transactions (max_prepared_transactions above 0 allows them).
 */
export const revocation = (): Query => ({
  text: `SELECT pg_catalog.current_setting('max_prepared_transactions')::int AS max_prepared, o.rolname AS owner,
           o.rolsuper OR (pg_catalog.pg_has_role(o.oid, 'pg_read_all_stats', 'USAGE') AND pg_catalog.pg_has_role(o.oid, 'pg_signal_backend', 'USAGE')) AS can_end
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles o ON o.oid = p.proowner
         WHERE p.oid = pg_catalog.to_regprocedure('fencepost.revoke_older_sessions()')`,
});

/** Serialises declarations (and the objects trigger's creation) of instances at once. */
export const lock = (): Query => ({
  text: 'LOCK TABLE fencepost.protected_prefixes, fencepost.protected_tables IN SHARE ROW EXCLUSIVE MODE',
});

/** DDL takes no parameters: names come from pg_class (regclass text, quoted), the fence key as a literal. */
/** Who runs `fencepost protect` (the hint for a missing TRIGGER privilege names it). */
export const currentUser = (): string => 'SELECT current_user AS u';

/** The name of the trigger `fencepost protect` puts on a protected table. */
export const PROTECT_TRIGGER = 'fencepost_fence';

export const dropTrigger = (rel: string) => `DROP TRIGGER IF EXISTS ${PROTECT_TRIGGER} ON ${rel}`;
export const tableTrigger = (rel: string, fenceKey: string) =>
  `CREATE TRIGGER ${PROTECT_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${rel} FOR EACH STATEMENT EXECUTE FUNCTION fencepost.refuse_unfenced_write(${pg.escapeLiteral(fenceKey)})`;
export const objectsTrigger = () =>
  `CREATE TRIGGER ${PROTECT_TRIGGER} BEFORE INSERT OR UPDATE ON fencepost.objects FOR EACH ROW EXECUTE FUNCTION fencepost.refuse_misfenced_object()`;
