// `fencepost/proxy`: the fencing proxy for embedding (build it, run it, its store and errors).
export { buildApp, type AppOptions } from './http/app.ts';
export { startProxy, createPool, type RunningProxy } from './server.ts';
export { loadConfig, ConfigError, type ProxyConfig } from './config.ts';
export { ERRORS, ApiError, type ErrorCode } from './errors.ts';
export { type FencedOp, type FencedResult, parseToken, MAX_TOKEN } from '../fence/index.ts';
export { FenceStore, type FenceStoreOptions, migrate } from '../fence/admin.ts';
