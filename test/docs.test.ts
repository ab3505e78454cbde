// The README and docs/*.md link to one another: every relative link must reach an existing file,
// and every #anchor an existing heading of the page it names (GitHub's anchor rules).
import { expect, test } from 'vitest';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

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
  return text.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-');
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
const pages = [join(REPO, 'README.md'), ...readdirSync(join(REPO, 'docs')).filter((f) => f.endsWith('.md')).map((f) => join(REPO, 'docs', f))];

test('anchors follow GitHub: punctuation and code marks dropped, spaces to hyphens, repeats numbered', () => {
  expect([...anchors('# HTTP API (v1)\n## `fencepost elect`\n## Library API (`src/election`)\n## Session timeout: fast vs slow\n## Errors\n```\n## not a heading\n```\n## Errors\n')]).toEqual([
    'http-api-v1',
    'fencepost-elect',
    'library-api-srcelection',
    'session-timeout-fast-vs-slow',
    'errors',
    'errors-1',
  ]);
});

test('the checker reports a missing file and a missing anchor, and skips code and absolute URLs', () => {
  const page = join(REPO, 'docs', 'example.md');
  const files: Record<string, string> = {
    [page]: '# Example\n[ok](#example) [gone](missing.md) [bad](../README.md#no-such-heading) [web](https://example.com/x#y)\n`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n',
    [join(REPO, 'README.md')]: '# fencepost\n',
  };
  expect(brokenLinks(page, (p) => files[p], (p) => p in files)).toEqual([
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
