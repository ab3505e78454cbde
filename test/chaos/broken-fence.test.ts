// The checker catches a broken fence: with the fence off (tools serve --fence-mode off) the proxies write without
// any fence, and a nemesis that only freezes leaders (SIGSTOP past the session timeout) makes
// zombies whose writes, sent after a newer leader's were acknowledged, are accepted.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import { runChaos } from '../../tools/chaos/run.ts';

test('with the fence off, the checker reports stale writes accepted (and exits non-zero)', async () => {
  const lines: string[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'fencepost-chaos-broken-'));
  const result = await runChaos({
    seed: 3,
    durationMs: 10_000,
    fenceMode: 'off',
    kinds: ['pause-writer'],
    gapMs: [300, 800],
    sessionTimeoutMs: 1500,
    dir,
    cleanup: true,
    print: (l) => lines.push(l),
  });
  const context = `${result.report}\n\n${lines.join('\n')}`;
  expect(result.ok, context).toBe(false);
  expect(result.faults.filter((f) => f.kind === 'pause-writer').length, context).toBeGreaterThan(0);
  const stale = result.check.violations.filter((v) => v.invariant === 'monotonic');
  expect(stale.length, context).toBeGreaterThan(0);
  expect(
    stale.some((v) => v.message.includes('accepted')),
    context,
  ).toBe(true);
  expect(result.report).toMatch(/FAIL: \d+ violations/);
}, 120_000);
