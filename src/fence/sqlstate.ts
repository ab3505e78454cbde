// The SQLSTATEs of Postgres's own errors that fencepost raises, answers or tells apart, named as
// Postgres names them (src/backend/utils/errcodes.txt). fencepost's own codes (class FP) are in
// codes.ts; what each code means to a door (retryable, unavailable, …) is in pg-errors.ts.

export const WARNING = '01000';
export const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION = '08001';
export const CONNECTION_FAILURE = '08006';
export const TRANSACTION_RESOLUTION_UNKNOWN = '08007';
export const PROTOCOL_VIOLATION = '08P01';
export const UNIQUE_VIOLATION = '23505';
export const READ_ONLY_SQL_TRANSACTION = '25006';
export const INVALID_AUTHORIZATION_SPECIFICATION = '28000';
export const INVALID_PASSWORD = '28P01';
export const INVALID_CATALOG_NAME = '3D000';
export const INVALID_SCHEMA_NAME = '3F000';
export const SERIALIZATION_FAILURE = '40001';
export const DEADLOCK_DETECTED = '40P01';
export const INSUFFICIENT_PRIVILEGE = '42501';
export const UNDEFINED_TABLE = '42P01';
export const DUPLICATE_OBJECT = '42710';
export const TOO_MANY_CONNECTIONS = '53300';
/** lock_timeout expired (class 55): nothing of the statement applied. */
export const LOCK_NOT_AVAILABLE = '55P03';
export const QUERY_CANCELED = '57014';
/** pg_terminate_backend, as a raise ends its holders; also a server shutting down. */
export const ADMIN_SHUTDOWN = '57P01';
export const CRASH_SHUTDOWN = '57P02';
export const CANNOT_CONNECT_NOW = '57P03';
export const INTERNAL_ERROR = 'XX000';
