#!/usr/bin/env node
// The `fencepost` command: runs the built JavaScript in dist/ (npm ci builds it through `prepare`;
// after editing src/, `npm run build`).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const main = new URL('../dist/cli/main.js', import.meta.url);
if (!existsSync(fileURLToPath(main))) {
  process.stderr.write('fencepost: dist/ is missing: run `npm run build` (npm ci runs it too)\n');
  process.exit(1);
}
await import(main.href);
