// Object and fence keys: 1–1024 bytes of UTF-8, no control characters.

export const MAX_KEY_BYTES = 1024;

// C0, DEL and C1 control characters. U+FFFD is refused too: it is what invalid UTF-8 decodes to.
const FORBIDDEN = /[\u0000-\u001f\u007f-\u009f\ufffd]/;

/** Returns null when the key is valid, else a reason for the error message. */
export function keyProblem(key: string): string | null {
  if (key.length === 0) return 'is empty';
  if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) return `is longer than ${MAX_KEY_BYTES} bytes`;
  if (FORBIDDEN.test(key)) return 'contains a control character or invalid UTF-8';
  if (!key.isWellFormed()) return 'is not valid UTF-8';
  return null;
}
