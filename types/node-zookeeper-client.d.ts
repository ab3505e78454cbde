// Types for the parts of node-zookeeper-client 1.1.3 that fencepost uses (the package ships none).
// `connectionManager` is internal to the package; src/election/zk-session.ts reaches into it for
// the things the public API lacks (closing a dead socket, seeing CONNECTING). Pin the version.
declare module 'node-zookeeper-client' {
  import type { EventEmitter } from 'node:events';
  import type { Socket } from 'node:net';

  namespace zookeeper {
    interface Stat {
      czxid: Buffer;
      mzxid: Buffer;
      ctime: Buffer;
      mtime: Buffer;
      version: number;
      cversion: number;
      aversion: number;
      /** Session id of the owner of an ephemeral node, 8 bytes big-endian; zero for persistent nodes. */
      ephemeralOwner: Buffer;
      dataLength: number;
      numChildren: number;
      pzxid: Buffer;
    }

    interface Event {
      type: number;
      name: string;
      path: string;
      getType(): number;
      getName(): string;
      getPath(): string;
    }

    interface Exception extends Error {
      code: number;
      name: string;
      path?: string;
      getCode(): number;
      getName(): string;
      getPath(): string | undefined;
    }

    interface ClientOptions {
      sessionTimeout?: number;
      spinDelay?: number;
      retries?: number;
      sessionId?: Buffer;
      sessionPassword?: Buffer;
    }

    interface ACLRecord {
      perms: number;
    }

    /** `new Id(scheme, id)`, e.g. ('digest', 'user:base64sha1') or ('world', 'anyone'). */
    interface Id {
      scheme: string;
      id: string;
    }

    /** `new ACL(permission, id)`; permission is a bit set of Permission. */
    interface ACL {
      permission: number;
      id: Id;
    }

    type Watcher = (event: Event) => void;

    /** Internal connection manager; numeric states from ConnectionManager.STATES. */
    interface ConnectionManager extends EventEmitter {
      state: number;
      socket?: Socket;
      sessionTimeout: number;
      connect(): void;
    }

    interface Client extends EventEmitter {
      connectionManager: ConnectionManager;
      connect(): void;
      close(): void;
      getSessionId(): Buffer;
      getSessionPassword(): Buffer;
      getSessionTimeout(): number;
      getState(): { name: string; code: number };
      create(path: string, data: Buffer | null, mode: number, callback: (error: Exception | null, path: string) => void): void;
      create(path: string, data: Buffer | null, acls: ACL[], mode: number, callback: (error: Exception | null, path: string) => void): void;
      /** Sent on every (re)connect, right after the connect request, before anything queued. */
      addAuthInfo(scheme: string, auth: Buffer): void;
      getACL(path: string, callback: (error: Exception | null, acls: ACL[], stat: Stat) => void): void;
      setACL(path: string, acls: ACL[], version: number, callback: (error: Exception | null, stat: Stat) => void): void;
      remove(path: string, version: number, callback: (error: Exception | null) => void): void;
      exists(path: string, watcher: Watcher, callback: (error: Exception | null, stat: Stat | null) => void): void;
      exists(path: string, callback: (error: Exception | null, stat: Stat | null) => void): void;
      getChildren(path: string, watcher: Watcher, callback: (error: Exception | null, children: string[], stat: Stat) => void): void;
      getChildren(path: string, callback: (error: Exception | null, children: string[], stat: Stat) => void): void;
      getData(path: string, callback: (error: Exception | null, data: Buffer | undefined, stat: Stat) => void): void;
      mkdirp(path: string, data: Buffer | null, mode: number, callback: (error: Exception | null, path: string) => void): void;
      mkdirp(path: string, data: Buffer | null, acls: ACL[], mode: number, callback: (error: Exception | null, path: string) => void): void;
      on(event: 'connected' | 'disconnected' | 'expired' | 'authenticationFailed' | 'connectedReadOnly', listener: () => void): this;
    }
  }

  const zookeeper: {
    createClient(connectionString: string, options?: zookeeper.ClientOptions): zookeeper.Client;
    ACL: new (permission: number, id: zookeeper.Id) => zookeeper.ACL;
    Id: new (scheme: string, id: string) => zookeeper.Id;
    CreateMode: { PERSISTENT: 0; EPHEMERAL: 1; PERSISTENT_SEQUENTIAL: 2; EPHEMERAL_SEQUENTIAL: 3 };
    Event: { NODE_CREATED: 1; NODE_DELETED: 2; NODE_DATA_CHANGED: 3; NODE_CHILDREN_CHANGED: 4 };
    Exception: {
      OK: 0;
      CONNECTION_LOSS: -4;
      OPERATION_TIMEOUT: -7;
      NO_NODE: -101;
      BAD_VERSION: -103;
      NODE_EXISTS: -110;
      NO_AUTH: -102;
      NOT_EMPTY: -111;
      SESSION_EXPIRED: -112;
    };
  };
  export = zookeeper;
}
