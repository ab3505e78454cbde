// The README and docs/*.md are checked two ways.
//
// Links: every relative link must reach an existing file, and every #anchor an existing heading of
// the page it names (GitHub's anchor rules).
//
// Commands: every `sh`, `bash`, `shell` and `console` block runs, unless the line before it is
// `<!-- not run: <why> -->`, or `<!-- run by <test file>: <name> -->` (a test of its own runs it
// against a server this one does not start, e.g. etcd; that file must exist and name the block). The
// pages run in reading order (the README, then the pages in the
// order the README links them), each in one bash session of its own (so a page's blocks share
// variables, functions and background jobs, as in a reader's terminal), stderr merged into stdout,
// in a scratch folder, with `fencepost` on the PATH (this checkout's bin/fencepost.js, run from the
// built dist/). One proxy serves every page: `fencepost serve` on the embedded default (no
// DATABASE_URL), with its own HOME, XDG_DATA_HOME and FENCEPOST_DATA_DIR in a temp folder, on free
// ports, with the SQL endpoint on. ZK_CONNECT is the suite's ZooKeeper, under a fresh chroot.
// - sh blocks run under `set -e`: every command must succeed.
// - console blocks are doctests: each `$ command` runs, and its output must match the lines below
//   it up to the next `$ `. A line `…` matches any number of lines; `…` within a line matches any
//   text. bash's notices of background jobs ended by a signal are not output. Volatile values match
//   loosely: a UUID matches any UUID, and a number with a fraction (`3.619`) or a time unit
//   (`2000 ms`, `2.7s`) matches any number. Trailing spaces are ignored.
// - Before a page runs, the addresses in its blocks become the test's: localhost:8080 and
//   127.0.0.1:8080 the proxy's HTTP port, :6432 its SQL endpoint, 127.0.0.1:27666 (the ZooKeeper
//   scripts/zookeeper.sh prints in the docs) the suite's ZooKeeper.
import { afterAll, beforeAll, expect, inject, test } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { listeningPorts } from '../tools/serve-listening.ts';
import { portRangeEnv } from '../tools/ports.ts';
import { ZkSession } from '../src/election/zk-session.ts';

const REPO = join(import.meta.dirname, '..');

/** The markdown lines outside fenced code blocks. */
function prose(markdown: string): string[] {
  const out: string[] = [];
  let fence: string | null = null;
  for (const line of markdown.split('\n')) {
    const open = /^\s{0,3}(`{3,}|~{3,})/.exec(line)?.[1];
    if (fence === null && open !== undefined) fence = open;
    else if (fence !== null && open !== undefined && open[0] === fence[0] && open.length >= fence.length) fence = null;
    else if (fence === null) out.push(line);
  }
  return out;
}

/** GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images keep their text
    .replace(/[`*]/g, '');
  return text
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
    .replace(/ /g, '-');
}

/** The anchors a page defines: one per heading (repeats get -1, -2, …), plus HTML id/name. */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const line of prose(markdown)) {
    const heading = /^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(line)?.[1];
    if (heading !== undefined) {
      const base = slug(heading);
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      out.add(n === 0 ? base : `${base}-${n}`);
    }
    for (const m of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) out.add(m[1]!);
  }
  return out;
}

/** The link targets of a page: inline links and images, outside code. */
function links(markdown: string): string[] {
  return prose(markdown).flatMap((line) =>
    [...line.replace(/`[^`]*`/g, '').matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!),
  );
}

/** Problems with the relative links of the page at `file` (absolute path); `read` gives undefined for a missing file. */
function brokenLinks(file: string, read: (path: string) => string | undefined, exists: (path: string) => boolean): string[] {
  const problems: string[] = [];
  const markdown = read(file) ?? '';
  for (const target of links(markdown)) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
    const hash = target.indexOf('#');
    const path = hash === -1 ? target : target.slice(0, hash);
    const anchor = hash === -1 ? undefined : decodeURIComponent(target.slice(hash + 1));
    const resolved = path === '' ? file : join(dirname(file), decodeURIComponent(path));
    const where = `${relative(REPO, file)}: (${target})`;
    if (!exists(resolved)) {
      problems.push(`${where}: no file ${relative(REPO, resolved)}`);
      continue;
    }
    if (anchor === undefined) continue;
    const page = resolved.endsWith('.md') ? read(resolved) : undefined;
    if (page === undefined) problems.push(`${where}: an anchor into a file that is not markdown`);
    else if (!anchors(page).has(anchor)) problems.push(`${where}: no heading #${anchor} in ${relative(REPO, resolved)}`);
  }
  return problems;
}

const readMarkdown = (path: string) => (existsSync(path) ? readFileSync(path, 'utf8') : undefined);
const pages = [
  join(REPO, 'README.md'),
  ...readdirSync(join(REPO, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => join(REPO, 'docs', f)),
];

test('anchors follow GitHub: punctuation and code marks dropped, spaces to hyphens, repeats numbered', () => {
  expect([
    ...anchors(
      '# HTTP API (v1)\n## `fencepost elect`\n## Library API (`src/election`)\n## Session timeout: fast vs slow\n## Errors\n```\n## not a heading\n```\n## Errors\n',
    ),
  ]).toEqual(['http-api-v1', 'fencepost-elect', 'library-api-srcelection', 'session-timeout-fast-vs-slow', 'errors', 'errors-1']);
});

test('the checker reports a missing file and a missing anchor, and skips code and absolute URLs', () => {
  const page = join(REPO, 'docs', 'example.md');
  const files: Record<string, string> = {
    [page]:
      '# Example\n[ok](#example) [gone](missing.md) [bad](../README.md#no-such-heading) [web](https://example.com/x#y)\n`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n',
    [join(REPO, 'README.md')]: '# fencepost\n',
  };
  expect(
    brokenLinks(
      page,
      (p) => files[p],
      (p) => p in files,
    ),
  ).toEqual([
    'docs/example.md: (missing.md): no file docs/missing.md',
    'docs/example.md: (../README.md#no-such-heading): no heading #no-such-heading in README.md',
  ]);
});

test('every relative link in README.md and docs/*.md reaches an existing file, and every #anchor an existing heading', () => {
  expect(pages.length).toBeGreaterThan(1);
  expect(pages.flatMap((p) => links(readFileSync(p, 'utf8'))).length).toBeGreaterThan(10);
  expect(pages.flatMap((p) => brokenLinks(p, readMarkdown, existsSync))).toEqual([]);
});

test('every docs page is linked from the README and links back to it', () => {
  const readme = readFileSync(join(REPO, 'README.md'), 'utf8');
  for (const page of pages.slice(1)) {
    const name = relative(REPO, page);
    expect(links(readme), name).toContain(name);
    expect(links(readFileSync(page, 'utf8')), name).toContain('../README.md');
  }
});

// ---- Command blocks -------------------------------------------------------------------------------

const SHELL_LANGS = new Set(['sh', 'bash', 'shell', 'console']);

interface Block {
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  lang: string;
  body: string[];
  /** The reason of a `<!-- not run: … -->` on the line before the fence (blank lines between allowed). */
  notRun?: string;
  /** `<!-- run by <test file>: <name> -->`: a test of its own runs the block (it needs a server this test does not start), naming it. */
  runBy?: { file: string; name: string };
  /** No closing fence before the end of the page. */
  unclosed?: boolean;
}

/** The fenced code blocks of a page. */
function blocks(file: string, markdown: string): Block[] {
  const out: Block[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^\s{0,3}(`{3,}|~{3,})\s*([\w-]*)/.exec(lines[i]!);
    if (!open) continue;
    const fence = open[1]!;
    let j = i + 1;
    while (
      j < lines.length &&
      !(lines[j]!.trim().startsWith(fence[0]!.repeat(fence.length)) && lines[j]!.trim().replace(/[`~]/g, '') === '')
    )
      j++;
    let k = i - 1;
    while (k >= 0 && lines[k]!.trim() === '') k--;
    const marker = k >= 0 ? /^\s*<!--\s*not run:(.*?)-->\s*$/.exec(lines[k]!) : null;
    const runBy = k >= 0 ? /^\s*<!--\s*run by (\S+): (.*?)\s*-->\s*$/.exec(lines[k]!) : null;
    const indent = /^\s*/.exec(lines[i]!)![0].length;
    const block: Block = {
      file,
      line: i + 1,
      lang: open[2]!,
      body: lines.slice(i + 1, j).map((l) => l.slice(Math.min(indent, /^\s*/.exec(l)![0].length))),
    };
    if (marker) block.notRun = marker[1]!.trim();
    if (runBy) block.runBy = { file: runBy[1]!, name: runBy[2]! };
    if (j === lines.length) block.unclosed = true;
    out.push(block);
    i = j;
  }
  return out;
}

/**
 * Problems with a page's blocks that no run can fix: a console block without a command, an empty
 * reason, a `$ ` sample not marked console.
 */
function blockProblems(bs: Block[]): string[] {
  const problems: string[] = [];
  for (const b of bs) {
    const where = `${b.file}:${b.line}`;
    if (b.unclosed) problems.push(`${where}: the block is not closed`);
    if (b.notRun !== undefined && b.notRun === '') problems.push(`${where}: "not run" without a reason`);
    if (b.runBy !== undefined) {
      const test = join(REPO, b.runBy.file);
      if (!existsSync(test)) problems.push(`${where}: "run by" names ${b.runBy.file}, which does not exist`);
      else if (!readFileSync(test, 'utf8').includes(b.runBy.name))
        problems.push(`${where}: ${b.runBy.file} does not name the block ${JSON.stringify(b.runBy.name)}`);
      continue;
    }
    if (SHELL_LANGS.has(b.lang) || b.notRun !== undefined) continue;
    if (b.lang === '' && b.body.some((l) => l.startsWith('$ ')))
      problems.push(`${where}: commands in a block without a language: mark it console`);
  }
  return problems;
}

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;
const LOOSE = new RegExp(`(…|${UUID.source}|\\d+(?:\\.\\d+)?(?= ?(?:ms|s)\\b)|\\d+\\.\\d+)`);

/** The regular expression an expected output line stands for (see the rule at the top). */
function linePattern(expected: string): RegExp {
  const parts = expected.trimEnd().split(LOOSE);
  const source = parts
    .map((part, i) => {
      if (i % 2 === 0) return part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
      if (part === '…') return '.*';
      if (UUID.test(part)) return UUID.source;
      return '\\d+(?:\\.\\d+)?';
    })
    .join('');
  return new RegExp(`^${source}$`, 's');
}

/** Whether `actual` lines match `expected` lines; a line `…` matches any number of lines. */
function outputMatches(expected: string[], actual: string[]): boolean {
  const patterns = expected.map((l) => (l.trim() === '…' ? null : linePattern(l)));
  const memo = new Map<string, boolean>();
  const go = (p: number, a: number): boolean => {
    const key = `${p},${a}`;
    const hit = memo.get(key);
    if (hit !== undefined) return hit;
    let ok: boolean;
    if (p === patterns.length) ok = a === actual.length;
    else if (patterns[p] === null) ok = go(p + 1, a) || (a < actual.length && go(p, a + 1));
    else ok = a < actual.length && patterns[p]!.test(actual[a]!.trimEnd()) && go(p + 1, a + 1);
    memo.set(key, ok);
    return ok;
  };
  return go(0, 0);
}

interface Step {
  block: Block;
  /** 1-based line of the command (console) or of the block's opening fence (sh). */
  line: number;
  /** The command (console) or the whole block (sh). */
  text: string;
  /** Expected output lines (console only). */
  expected?: string[];
}

/** The steps of a page's runnable blocks, in order. */
function steps(bs: Block[]): Step[] {
  const out: Step[] = [];
  for (const b of bs) {
    if (!SHELL_LANGS.has(b.lang) || b.notRun !== undefined || b.runBy !== undefined) continue;
    if (b.lang !== 'console') {
      out.push({ block: b, line: b.line, text: b.body.join('\n') });
      continue;
    }
    let current: Step | undefined;
    for (const [n, line] of b.body.entries()) {
      if (line.startsWith('$ ')) {
        current = { block: b, line: b.line + 1 + n, text: line.slice(2), expected: [] };
        out.push(current);
      } else if (current) current.expected!.push(line);
      else if (line.trim() !== '')
        throw new Error(`${b.file}:${b.line}: console output before the first $ command (mark the block "not run" if it is only a sample)`);
    }
    if (!current) throw new Error(`${b.file}:${b.line}: a console block without a $ command`);
  }
  for (const s of out) while (s.expected && s.expected.length > 0 && s.expected.at(-1)!.trim() === '') s.expected.pop();
  return out;
}

/** Puts the test's addresses in place of the docs' sample ones. */
function rewrite(text: string, ports: { http: number; pg: number; zk: string }): string {
  return text
    .replace(/\b(localhost|127\.0\.0\.1):8080\b/g, `$1:${ports.http}`)
    .replace(/\b(localhost|127\.0\.0\.1|proxy):6432\b/g, `$1:${ports.pg}`)
    .replace(/\b127\.0\.0\.1:27666\b/g, ports.zk);
}

const MARK = '\u001eFP';
/** bash's notice that a background job ended by a signal (`.page.sh: line 21: 812 Killed  fencepost elect …`): not the command's output. */
const JOB_NOTICE = /^\.page\.sh: line \d+: +\d+ (Killed|Terminated)\b/;

/** Runs a page's steps in one bash session; returns a problem per step that failed or did not match. */
async function runPage(
  pageSteps: Step[],
  env: Record<string, string>,
  ports: { http: number; pg: number; zk: string },
  timeoutMs = 120_000,
): Promise<string[]> {
  const work = mkdtempSync(join(env.HOME!, 'page-'));
  const script = [
    'exec 2>&1',
    `__fp() { local rc=$?; printf '\\n${MARK} %s %s${MARK}\\n' "$1" "$rc"; return $rc; }`,
    "trap '__fp exit' EXIT",
    ...pageSteps.flatMap((s, i) =>
      s.expected === undefined ? ['set -e', rewrite(s.text, ports), 'set +e', `__fp ${i}`] : [rewrite(s.text, ports), `__fp ${i}`],
    ),
  ].join('\n');
  writeFileSync(join(work, '.page.sh'), script + '\n');
  const child: ChildProcess = spawn('bash', ['.page.sh'], { cwd: work, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const timer = setTimeout(() => killGroup(child), timeoutMs);
  await new Promise<void>((resolve) => child.once('close', () => resolve()));
  clearTimeout(timer);
  killGroup(child); // background jobs a block left running
  const results = new Map<string, { output: string; rc: number }>();
  const re = new RegExp(`\\n?${MARK} (\\S+) (\\d+)${MARK}\\n`, 'g');
  let from = 0;
  for (const m of out.matchAll(re)) {
    results.set(m[1]!, { output: out.slice(from, m.index), rc: Number(m[2]) });
    from = m.index! + m[0].length;
  }
  const problems: string[] = [];
  for (const [i, s] of pageSteps.entries()) {
    const where = `${s.block.file}:${s.line}`;
    const r = results.get(String(i));
    if (r === undefined) {
      const exit = results.get('exit');
      problems.push(
        `${where}: ${s.expected === undefined ? 'sh block' : `$ ${s.text}`}: did not finish (the page's shell ${exit ? `exited with ${exit.rc}` : `timed out after ${timeoutMs} ms`}); output:\n${exit?.output ?? out.slice(from)}`,
      );
      break;
    }
    const actual = r.output.split('\n').filter((l) => !JOB_NOTICE.test(l));
    while (actual.length > 0 && actual.at(-1)!.trim() === '') actual.pop();
    if (
      s.expected !== undefined &&
      !outputMatches(
        s.expected.map((l) => rewrite(l, ports)),
        actual,
      )
    ) {
      problems.push(
        `${where}: $ ${s.text}\n--- expected\n${rewrite(s.expected.join('\n'), ports)}\n--- actual (exit ${r.rc})\n${actual.join('\n')}`,
      );
    }
  }
  rmSync(work, { recursive: true, force: true });
  return problems;
}

function killGroup(child: ChildProcess): void {
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {}
}

test('a doctest line matches volatile values loosely and everything else exactly', () => {
  expect(
    outputMatches(['x-request-id: 01d7d317-9d46-417e-9000-c8f2663cf5ce'], ['x-request-id: 51c18910-3345-4798-ad37-9d774c72bcae']),
  ).toBe(true);
  expect(outputMatches(['median 1.85 ms, over 5000 ms, +  2.715s'], ['median 12.3 ms, over 2000 ms, +  9.5s'])).toBe(true);
  expect(outputMatches(['token=0  version=1'], ['token=0  version=2'])).toBe(false); // integers without a unit are exact
  expect(outputMatches(['replica-… token 0'], ['replica-b token 0'])).toBe(true);
  expect(outputMatches(['a', '…', 'z'], ['a', 'z'])).toBe(true);
  expect(outputMatches(['a', '…', 'z'], ['a', 'b', 'c', 'z'])).toBe(true);
  expect(outputMatches(['a', '…', 'z'], ['a', 'b'])).toBe(false);
  expect(outputMatches(['{"a":1}'], ['{"a":1} '])).toBe(true); // trailing spaces
  expect(outputMatches(['GRANT'], ['GRANT', 'extra'])).toBe(false);
});

test('blocks: a "not run" comment before a block gives its reason; $ lines outside console blocks and unclosed blocks are flagged', () => {
  const bs = blocks(
    'x.md',
    '<!-- not run: needs Docker -->\n```sh\ndocker ps\n```\n\n```console\n$ echo hi\nhi\n```\n<!-- not run: -->\n```sh\nx\n```\n```\n$ ls\n```\n```sh\nnever closed\n',
  );
  expect(bs.map((b) => [b.line, b.lang, b.notRun])).toEqual([
    [2, 'sh', 'needs Docker'],
    [6, 'console', undefined],
    [11, 'sh', ''],
    [14, '', undefined],
    [17, 'sh', undefined],
  ]);
  expect(blockProblems(bs)).toEqual([
    'x.md:11: "not run" without a reason',
    'x.md:14: commands in a block without a language: mark it console',
    'x.md:17: the block is not closed',
  ]);
  expect(steps(bs.slice(0, 4)).map((s) => [s.text, s.expected])).toEqual([['echo hi', ['hi']]]);
});

test('blocks: a "run by" comment names a test file that exists and names the block; such a block is not run here', () => {
  const absent = ['absent', 'block', 'x7'].join('-'); // named nowhere in this file
  const bs = blocks(
    'x.md',
    `<!-- run by test/docs.test.ts: a block named here -->\n\`\`\`sh\netcdctl lock x\n\`\`\`\n<!-- run by test/no-such.test.ts: y -->\n\`\`\`sh\ny\n\`\`\`\n<!-- run by test/docs.test.ts: ${absent} -->\n\`\`\`sh\nz\n\`\`\`\n`,
  );
  expect(bs.map((b) => b.runBy)).toEqual([
    { file: 'test/docs.test.ts', name: 'a block named here' },
    { file: 'test/no-such.test.ts', name: 'y' },
    { file: 'test/docs.test.ts', name: absent },
  ]);
  expect(blockProblems(bs)).toEqual([
    'x.md:6: "run by" names test/no-such.test.ts, which does not exist',
    `x.md:10: test/docs.test.ts does not name the block "${absent}"`,
  ]);
  expect(steps(bs)).toEqual([]);
});

/** README first, then the docs pages in the order the README's Documentation list links them, then any others. */
function readingOrder(): string[] {
  const readme = join(REPO, 'README.md');
  const list = /^## Documentation\n([\s\S]*?)(?=^## )/m.exec(readFileSync(readme, 'utf8'))?.[1] ?? '';
  const linked = links(list)
    .filter((l) => /^docs\/[^#]+\.md$/.test(l))
    .map((l) => join(REPO, l));
  return [...new Set([readme, ...linked, ...pages])];
}

let tmp: string;
let proxy: ChildProcess | undefined;
let proxyOutput = '';
let env: Record<string, string>;
let ports: { http: number; pg: number; zk: string };

beforeAll(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'fencepost-docs-'));
  chmodSync(tmp, 0o755); // as root, the embedded Postgres runs as the postgres user
  const home = join(tmp, 'home');
  const bin = join(tmp, 'bin');
  mkdirSync(bin, { recursive: true });
  writeFileSync(
    join(bin, 'fencepost'),
    `#!/bin/sh\nexec ${JSON.stringify(process.execPath)} ${JSON.stringify(join(REPO, 'bin', 'fencepost.js'))} "$@"\n`,
    { mode: 0o755 },
  );
  const dataDir = join(home, '.local', 'share', 'fencepost', 'docs', 'pgdata');
  mkdirSync(dirname(dataDir), { recursive: true });
  // A chroot of its own on the suite's ZooKeeper: election paths such as /demo/nightly are the docs' own.
  const zkConnect = inject('zkConnect');
  const chroot = `/fencepost-test/docs-${randomUUID().slice(0, 8)}`;
  const zk = await ZkSession.open({ connect: zkConnect, sessionTimeoutMs: 4000 });
  try {
    await zk.mkdirp(chroot);
  } finally {
    await zk.close();
  }
  env = {
    PATH: `${bin}:${process.env.PATH ?? '/usr/bin:/bin'}`,
    HOME: home,
    XDG_DATA_HOME: join(home, '.local', 'share'),
    FENCEPOST_DATA_DIR: dataDir, // as root the default would be /var/lib/fencepost
    ZK_CONNECT: `${zkConnect}${chroot}`,
    LANG: 'C.UTF-8',
    TMPDIR: tmp,
    ...portRangeEnv(), // the pages' servers and the serve below: ports of FENCEPOST_PORT_RANGE when set
  };
  // Free ports (of FENCEPOST_PORT_RANGE when set), read back from serve's listening lines (at info).
  proxy = spawn(process.execPath, [join(REPO, 'bin', 'fencepost.js'), 'serve'], {
    env: { ...env, PORT: '0', FENCEPOST_PGWIRE_PORT: '0', FENCEPOST_LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  proxy.stdout!.on('data', (d: Buffer) => (proxyOutput += d.toString()));
  proxy.stderr!.on('data', (d: Buffer) => (proxyOutput += d.toString()));
  for (;;) {
    if (proxy.exitCode !== null) throw new Error(`fencepost serve exited with ${proxy.exitCode}:\n${proxyOutput}`);
    const bound = listeningPorts(proxyOutput, true);
    if (
      bound !== null &&
      (await fetch(`http://127.0.0.1:${bound.http}/readyz`).then(
        (r) => r.ok,
        () => false,
      ))
    ) {
      ports = { http: bound.http, pg: bound.pgwire!, zk: `${zkConnect}${chroot}` };
      break;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}, 120_000);

afterAll(async () => {
  if (proxy && proxy.exitCode === null) {
    const exited = new Promise((r) => proxy!.once('exit', r));
    proxy.kill('SIGTERM');
    await exited;
  }
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}, 60_000);

// Whatever a page says to run does what the page says: a stale example fails here.
test('every shell and console block of the README and docs/*.md runs and prints what it shows, or says why it cannot run here', async () => {
  const problems: string[] = [];
  let ran = 0;
  for (const page of readingOrder()) {
    const name = relative(REPO, page);
    const bs = blocks(name, readFileSync(page, 'utf8'));
    problems.push(...blockProblems(bs));
    const pageSteps = steps(bs);
    ran += pageSteps.length;
    if (pageSteps.length > 0) problems.push(...(await runPage(pageSteps, env, ports)));
  }
  expect(ran).toBeGreaterThan(10);
  expect(problems).toEqual([]);
}, 300_000);
