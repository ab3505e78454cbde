// The package's public API: the election library, the writer client, and the proxy for embedding.
export * from './election/index.ts';
export * from './writer/index.ts';
export { advanceFence, type AdvanceOutcome } from './writer/advance.ts';
export { buildApp, type AppOptions } from './proxy/http/app.ts';
export { startProxy, createPool, type RunningProxy } from './proxy/server.ts';
export { loadConfig, ConfigError, type ProxyConfig } from './proxy/config.ts';
export { ERRORS, ApiError, type ErrorCode } from './proxy/errors.ts';
export { type FencedOp, type FencedResult, parseToken, MAX_TOKEN } from './fence/index.ts';
export { FenceStore, type FenceStoreOptions, migrate } from './fence/admin.ts';
