// Headless Chromium for browser tests: Debian's `chromium` package driven by playwright-core.
import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';

export const CHROMIUM_PATH = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM_PATH))
    throw new Error(`no Chromium at ${CHROMIUM_PATH}: run scripts/setup.sh (apt-get install chromium) or set CHROMIUM_PATH`);
  return await chromium.launch({
    executablePath: CHROMIUM_PATH,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-background-networking',
      '--disable-gpu',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
}
