// The command after `--`, checked before `fencepost elect` campaigns: a command that cannot start
// would otherwise take a term (and its token), fail with ENOENT, and leave the job unrun.
import { accessSync, constants, statSync } from 'node:fs';
import { delimiter, isAbsolute, join, resolve } from 'node:path';

/**
 * Why `command` cannot be started as spawn() would start it (a name searched on PATH, or a path
 * with a slash, relative to `cwd`), or null if it can: an executable regular file.
 */
export function commandProblem(command: string, env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): string | null {
  if (command === '') return 'the command after -- is empty';
  if (command.includes('/') || (process.platform === 'win32' && command.includes('\\'))) {
    const path = isAbsolute(command) ? command : resolve(cwd, command);
    return fileProblem(path, command);
  }
  if (process.platform === 'win32') return null; // PATHEXT and the like: left to spawn
  const dirs = (env.PATH ?? '').split(delimiter).map((d) => (d === '' ? cwd : d));
  for (const dir of dirs) if (fileProblem(join(dir, command), command) === null) return null;
  return `the command ${JSON.stringify(command)} (after --) is not an executable on PATH`;
}

function fileProblem(path: string, command: string): string | null {
  let isFile: boolean;
  try {
    isFile = statSync(path).isFile();
  } catch {
    return `the command ${JSON.stringify(command)} (after --) does not exist`;
  }
  if (!isFile) return `the command ${JSON.stringify(command)} (after --) is not a file`;
  try {
    accessSync(path, constants.X_OK);
  } catch {
    return `the command ${JSON.stringify(command)} (after --) is not executable`;
  }
  return null;
}
