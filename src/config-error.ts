// A setting with a value the process cannot use: thrown while reading settings at start, before
// anything runs; the CLI prints its message alone (`fencepost: invalid configuration: …`). Outside
// the layers (src/proxy, src/fence, src/demo and src/ports.ts each throw it), so none imports
// another for it; src/proxy/config.ts, where most settings are read, exports it too.
export class ConfigError extends Error {
  constructor(
    /** The setting at fault (an environment variable's name). */
    readonly variable: string,
    message: string,
  ) {
    super(`${variable}: ${message}`);
    this.name = 'ConfigError';
  }
}
