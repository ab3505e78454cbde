// Why a command (elect, leader…) cannot go on, for a reason the user can fix: the CLI prints
// `fencepost <command>: <message>` alone, no stack (the cause is the message, naming the flag or
// setting to look at), and exits 1. The original error stays as `cause`.
export class CommandFailure extends Error {
  constructor(
    /** The subcommand, e.g. `elect`. */
    readonly command: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'CommandFailure';
  }
}

/** The first line of what was thrown, for a one-line message. */
export function firstLine(err: unknown): string {
  const message = err instanceof Error ? err.message || err.name : String(err);
  return message.split('\n')[0]!;
}
