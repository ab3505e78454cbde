export { FencedWriter, NotLeaderError } from './fenced-writer.ts';
export type { FencedWriterEvents, FencedWriterOptions } from './fenced-writer.ts';
export { ProxyClient, ProxyError, StaleTokenError } from './proxy-client.ts';
export type { FenceInfo, ProxyClientOptions, PutResult, StoredObject } from './proxy-client.ts';
export { fenceRefusal } from './fence-refusal.ts';
export type { FenceRefusal } from './fence-refusal.ts';
