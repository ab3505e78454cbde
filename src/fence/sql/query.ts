// A statement the fence runs: { name?, text, values }. Named statements are prepared once per
// connection by node-postgres. Every statement lives in a module of this folder, by concern.
import type { QueryConfig } from 'pg';

export type Query = QueryConfig<unknown[]>;
