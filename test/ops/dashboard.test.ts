// GET /dashboard: served self-contained, and live in a real headless Chromium: a rejected write
// made over HTTP shows up on the open page without a reload.
import { STORE_DEFAULTS } from '../../src/proxy/config.ts';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import type { Browser } from 'playwright-core';
import { buildApp } from '../../src/proxy/http/app.ts';
import { parseKeys } from '../../src/proxy/access/keys.ts';
import { FenceStore } from '../../src/fence/store.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { listen, REPO, testApp } from '../support/proxy.ts';
import { launchChromium } from '../../tools/chromium.ts';

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
let browser: Browser;

beforeAll(async () => {
  db = await createTestDatabase();
  app = testApp(db.pool);
  url = await listen(app);
  browser = await launchChromium();
});
afterAll(async () => {
  await browser?.close();
  await app?.close();
  await db?.drop();
});

const write = (path: string, token: string, headers: Record<string, string> = {}) =>
  fetch(`${url}${path}`, { method: 'PUT', headers: { 'fencing-token': token, ...headers }, body: '{}' });

describe('serving', () => {
  test('the page and its assets are served with a CSP that allows only this origin', async () => {
    const page = await app.inject({ url: '/dashboard' });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(page.headers['content-security-policy']).toContain("default-src 'none'");
    expect(page.headers['content-security-policy']).toContain("connect-src 'self'");
    for (const [path, type] of [
      ['/dashboard/dashboard.js', 'text/javascript'],
      ['/dashboard/dashboard.css', 'text/css'],
    ]) {
      const res = await app.inject({ url: path! });
      expect(res.statusCode, path).toBe(200);
      expect(res.headers['content-type']).toContain(type);
    }
  });

  test('nothing refers to another host: no http(s) or protocol-relative URLs in the page or its assets', async () => {
    for (const path of ['/dashboard', '/dashboard/dashboard.js', '/dashboard/dashboard.css']) {
      const body = (await app.inject({ url: path })).body;
      // The SVG namespace is an identifier, not a fetch.
      const urls = [...body.matchAll(/(?:https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}/gi)].map((m) => m[0]).filter((u) => u !== 'http://www.w3.org');
      expect(urls, path).toEqual([]);
    }
  });
});

describe('in headless Chromium', () => {
  test('a rejected write raises the rejected count on the open page without a reload', async () => {
    // Some history first: a leader at 7 and one zombie write refused.
    expect((await write('/v1/objects/orders%2F1', '7', { 'fence-key': 'orders' })).status).toBe(200);
    expect((await write('/v1/objects/orders%2F1', '6', { 'fence-key': 'orders', 'writer-id': 'zombie-1' })).status).toBe(409);

    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
    const page = await context.newPage();
    const problems: string[] = [];
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
    const origins = new Set<string>();
    page.on('request', (r) => origins.add(new URL(r.url()).origin));
    let navigations = 0;
    page.on('framenavigated', (f) => f === page.mainFrame() && navigations++);
    try {
      await page.goto(`${url}/dashboard?refreshMs=300`);
      const rejected = page.locator('#total-rejected');
      await expect.poll(() => rejected.getAttribute('data-value'), { timeout: 10_000 }).toBe('1');
      expect(await page.locator('#total-accepted').getAttribute('data-value')).toBe('1');
      expect(await page.locator('#status').getAttribute('data-state')).toBe('live');

      // A new zombie write, over plain HTTP, while the page stays open.
      expect((await write('/v1/objects/orders%2F2', '5', { 'fence-key': 'orders', 'writer-id': 'zombie-2' })).status).toBe(409);
      await expect.poll(() => rejected.getAttribute('data-value'), { timeout: 10_000 }).toBe('2');

      const fenceRow = page.locator('#fences tbody tr[data-fence-key="orders"]');
      await expect.poll(() => fenceRow.locator('.rejected').textContent()).toBe('2');
      expect(await fenceRow.locator('.highest-token').textContent()).toBe('7');
      const latest = page.locator('#rejections tbody tr').first();
      await expect.poll(() => latest.textContent()).toContain('zombie-2');
      expect(await latest.textContent()).toContain('orders/2');
      expect(await latest.locator('.door').textContent()).toBe('http'); // which door refused it
      // The chart's bars add up to the rejections in the window.
      const bars = await page.locator('#chart rect.bar').evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-count'))));
      expect(bars).toHaveLength(60);
      expect(bars.reduce((a, b) => a + b, 0)).toBe(2);

      expect(navigations).toBe(1); // no reload happened
      expect([...origins]).toEqual([new URL(url).origin]); // nothing loaded from elsewhere
      expect(problems).toEqual([]);
      mkdirSync(join(REPO, 'test-artifacts'), { recursive: true });
      await page.screenshot({ path: join(REPO, 'test-artifacts', 'dashboard.png'), fullPage: true });
    } finally {
      await context.close();
    }
  });

  test("each fence shows its highest token and the writer that raised it, from object writes and transactions, and follows a new leader's raise", async () => {
    // Invariant: the writer shown is the one whose write raised the fence to the token shown.
    expect((await write('/v1/objects/ledger%2F1', '3', { 'fence-key': 'ledger', 'writer-id': 'replica-a' })).status).toBe(200);
    expect((await write('/v1/objects/ledger%2F2', '3', { 'fence-key': 'ledger' })).status).toBe(200); // same token, no id: still replica-a's
    const tx = await fetch(`${url}/v1/transactions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'writer-id': 'replica-tx' },
      body: JSON.stringify({ fences: [{ key: 'ledger-tx', token: '5' }], statements: [{ sql: 'SELECT 1' }] }),
    });
    expect(tx.status, await tx.clone().text()).toBe(200);
    const page = await browser.newPage();
    try {
      await page.goto(`${url}/dashboard?refreshMs=300`);
      const row = (key: string) => page.locator(`#fences tbody tr[data-fence-key="${key}"]`);
      await expect.poll(() => row('ledger').locator('.raised-by').textContent(), { timeout: 10_000 }).toBe('replica-a');
      expect(await row('ledger').locator('.highest-token').textContent()).toBe('3');
      expect(await row('ledger-tx').locator('.raised-by').textContent()).toBe('replica-tx');
      expect(await row('orders').locator('.raised-by').textContent()).toBe('—'); // raised without a Writer-Id

      // A new leader raises the fence while the page is open.
      expect((await write('/v1/objects/ledger%2F1', '4', { 'fence-key': 'ledger', 'writer-id': 'replica-b' })).status).toBe(200);
      await expect.poll(() => row('ledger').locator('.highest-token').textContent(), { timeout: 10_000 }).toBe('4');
      expect(await row('ledger').locator('.raised-by').textContent()).toBe('replica-b');
    } finally {
      await page.close();
    }
    // The same in the API and the view operators query.
    expect(await (await fetch(`${url}/v1/fences/ledger`)).json()).toMatchObject({
      fenceKey: 'ledger',
      highestToken: '4',
      raisedBy: 'replica-b',
    });
    const list = (await (await fetch(`${url}/v1/fences?limit=1000`)).json()) as {
      fences: Array<{ fenceKey: string; raisedBy: string | null }>;
    };
    expect(list.fences.find((f) => f.fenceKey === 'ledger-tx')?.raisedBy).toBe('replica-tx');
    const { rows } = await db.pool.query(
      `SELECT fence_key, highest_token::text, raised_by FROM fencepost.fence_stats WHERE fence_key LIKE 'ledger%' ORDER BY fence_key`,
    );
    expect(rows).toEqual([
      { fence_key: 'ledger', highest_token: '4', raised_by: 'replica-b' },
      { fence_key: 'ledger-tx', highest_token: '5', raised_by: 'replica-tx' },
    ]);
  });

  test('keys and writer ids are shown as text, never run as HTML', async () => {
    const evil = '<img src=x onerror="window.__pwned=1">';
    expect((await write(`/v1/objects/${encodeURIComponent(evil)}`, '9', { 'writer-id': '<i>raiser</i>' })).status).toBe(200);
    expect((await write(`/v1/objects/${encodeURIComponent(evil)}`, '8', { 'writer-id': '<b>bold</b>' })).status).toBe(409);
    const page = await browser.newPage();
    try {
      await page.goto(`${url}/dashboard?refreshMs=300`);
      const row = page.locator('#fences tbody tr').filter({ hasText: evil });
      await expect.poll(() => row.count(), { timeout: 10_000 }).toBe(1);
      await expect.poll(() => page.locator('#rejections tbody').textContent()).toContain('<b>bold</b>');
      expect(await row.locator('.raised-by').textContent()).toBe('<i>raiser</i>');
      expect(await page.locator('#rejections tbody b, #fences tbody img, #fences tbody i').count()).toBe(0);
      expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();
    } finally {
      await page.close();
    }
  });

  test('the page says it is not updating when the API fails, and recovers', async () => {
    const page = await browser.newPage();
    try {
      let fail = false;
      await page.route('**/v1/stats*', (route) =>
        fail
          ? route.fulfill({ status: 503, contentType: 'application/json', body: '{"error":"unavailable","message":"x"}' })
          : route.continue(),
      );
      await page.goto(`${url}/dashboard?refreshMs=300`);
      await expect.poll(() => page.locator('#status').getAttribute('data-state'), { timeout: 10_000 }).toBe('live');
      fail = true;
      await expect.poll(() => page.locator('#status').getAttribute('data-state'), { timeout: 10_000 }).toBe('error');
      expect(await page.locator('#status-text').textContent()).toContain('unavailable');
      fail = false;
      await expect.poll(() => page.locator('#status').getAttribute('data-state'), { timeout: 10_000 }).toBe('live');
    } finally {
      await page.close();
    }
  });
});

describe('with bearer keys required for reads', () => {
  test('the page loads, asks for a key, and goes live once one is given', async () => {
    const secret = 'ops-read-key-0123456789';
    const secured = buildApp({
      store: new FenceStore(db.pool, STORE_DEFAULTS),
      bodyLimitBytes: 1024,
      auth: { keys: parseKeys(JSON.stringify([{ name: 'ops', secret, readOnly: true }])), readAccess: 'key' },
    });
    const securedUrl = await listen(secured);
    const page = await browser.newPage();
    try {
      expect((await fetch(`${securedUrl}/v1/stats`)).status).toBe(401);
      expect((await fetch(`${securedUrl}/v1/rejections`)).status).toBe(401);
      expect((await fetch(`${securedUrl}/metrics`)).status).toBe(401); // metrics follow FENCEPOST_READ_ACCESS
      expect((await fetch(`${securedUrl}/metrics`, { headers: { authorization: `Bearer ${secret}` } })).status).toBe(200);
      const sent: (string | undefined)[] = [];
      page.on('request', (r) => r.url().includes('/v1/stats') && sent.push(r.headers().authorization));
      const res = await page.goto(`${securedUrl}/dashboard?refreshMs=300`);
      expect(res?.status()).toBe(200);
      await expect.poll(() => page.locator('#status').getAttribute('data-state'), { timeout: 10_000 }).toBe('error');
      expect(await page.locator('#status-text').textContent()).toContain('unauthorized');
      await page.locator('#key-form').waitFor({ state: 'visible' });
      await page.locator('#key-input').fill(secret);
      await page.locator('#key-form button').click();
      await expect.poll(() => page.locator('#status').getAttribute('data-state'), { timeout: 10_000 }).toBe('live');
      expect(await page.locator('#key-form').isHidden()).toBe(true);
      const { rejected } = (await (await fetch(`${securedUrl}/v1/stats`, { headers: { authorization: `Bearer ${secret}` } })).json()) as {
        rejected: number;
      };
      expect(await page.locator('#total-rejected').getAttribute('data-value')).toBe(String(rejected));
      expect(sent.at(-1)).toBe(`Bearer ${secret}`);
    } finally {
      await page.close();
      await secured.close();
    }
  });
});
