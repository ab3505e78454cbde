// The command must never outlive `fencepost elect`: when elect dies without stopping it (SIGKILL,
// the OOM killer, a crash), its lease runs out and a standby is elected, so a command still running
// would be a second leader. Node cannot ask Linux for a parent-death signal (no prctl), and that
// would reach only the command's first process anyway, not the rest of its process group. So each
// command gets a guardian: a tiny `sh` in a session of its own (a signal to elect's process group
// does not reach it) that reads a pipe whose only writer is elect. Elect writes the command's
// process group id, then, once the command has exited or been stopped, `release`. End of file
// without `release` means elect is gone, whatever killed it: the guardian sends SIGTERM to the
// command's process group, and SIGKILL once `killAfterMs` has passed with any of it left.
//
// The guardian is started before the command, so the command is never unguarded but for the
// instant between spawning it and writing its group id (two consecutive system calls in elect).
// If the guardian itself dies, elect notices and says so; the command stays under elect's own care.
import { spawn, type ChildProcess } from 'node:child_process';
import type { Logger } from 'pino';

// $1: polls of 50 ms before SIGKILL. Ignores the signals a terminal or an init system sends to a
// whole group or session: it must outlive elect, never die with it.
const SCRIPT = `
trap '' HUP INT TERM QUIT PIPE
IFS= read -r pgid || exit 0
case $pgid in ''|*[!0-9]*) exit 0 ;; esac
while IFS= read -r line; do
  [ "$line" = release ] && exit 0
done
kill -TERM -"$pgid" 2>/dev/null || exit 0
printf '{"level":50,"pid":%s,"childPgid":%s,"msg":"fencepost elect is gone without stopping its command: SIGTERM to the process group of the command"}\\n' "$$" "$pgid" >&2
i=0
while [ "$i" -lt "$1" ]; do
  kill -0 -"$pgid" 2>/dev/null || exit 0
  sleep 0.05
  i=$((i + 1))
done
kill -KILL -"$pgid" 2>/dev/null
exit 0
`;

/** Longest wait for a released guardian to exit (it does at once; this only bounds a stuck one). */
const RELEASE_WAIT_MS = 1000;

export class Guardian {
  private released = false;
  private readonly gone: Promise<void>;

  private constructor(
    private readonly proc: ChildProcess,
    log: Logger,
  ) {
    proc.stdin?.on('error', () => {}); // EPIPE if it died; 'exit' below reports that
    this.gone = new Promise((resolve) => {
      proc.once('error', () => resolve());
      proc.once('exit', (code, signal) => {
        if (!this.released)
          log.error(
            { guardianPid: proc.pid, code, signal },
            'the guardian of the command exited: the command is no longer killed if fencepost elect dies',
          );
        resolve();
      });
    });
    proc.unref();
  }

  /** Starts a guardian (null where there is no POSIX shell, e.g. Windows). */
  static start(killAfterMs: number, log: Logger): Guardian | null {
    if (process.platform === 'win32') return null;
    const polls = Math.max(1, Math.ceil(killAfterMs / 50));
    const proc = spawn('/bin/sh', ['-c', SCRIPT, 'fencepost-guardian', String(polls)], {
      stdio: ['pipe', 'ignore', 'inherit'],
      detached: true, // a session of its own: signals to elect's group or session do not reach it
    });
    proc.once('error', (err) => log.error({ err }, 'could not start the guardian of the command'));
    return new Guardian(proc, log);
  }

  get pid(): number | undefined {
    return this.proc.pid;
  }

  /** From now on, if this process dies, the guardian kills process group `pgid`. */
  guard(pgid: number): void {
    this.proc.stdin?.write(`${pgid}\n`);
  }

  /**
   * The command is gone: the guardian exits without killing anything. Resolves once it has (so a
   * `release` never sits unread in the pipe when this process exits, which would read as our death).
   */
  async release(): Promise<void> {
    if (!this.released) {
      this.released = true;
      this.proc.stdin?.end('release\n');
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.gone, new Promise<void>((r) => (timer = setTimeout(r, RELEASE_WAIT_MS)))]);
    clearTimeout(timer);
  }
}
