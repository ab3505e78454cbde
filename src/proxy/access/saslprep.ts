// SASLprep (RFC 4013, the stringprep profile for passwords) as Postgres and libpq apply it to SCRAM
// passwords: map non-ASCII spaces to U+0020 and remove the "commonly mapped to nothing" characters,
// normalise to NFKC, refuse prohibited characters and bad bidirectional text. Unassigned code
// points are allowed (the RFC's "query" strings; Postgres allows them too). Where the password
// cannot be prepared, Postgres and libpq use its bytes as they are: `saslprepOrRaw` does the same,
// so both ends still derive the same keys.
//
// Tables from RFC 3454 (appendices B.1, C.1.2, C.2–C.9, D.1) as [first, last] code point ranges.
type Ranges = readonly (readonly [number, number])[];

const NON_ASCII_SPACE: Ranges = [
  [0x00a0, 0x00a0],
  [0x1680, 0x1680],
  [0x2000, 0x200b],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
];

const MAPPED_TO_NOTHING: Ranges = [
  [0x00ad, 0x00ad],
  [0x034f, 0x034f],
  [0x1806, 0x1806],
  [0x180b, 0x180d],
  [0x200b, 0x200d],
  [0x2060, 0x2060],
  [0xfe00, 0xfe0f],
  [0xfeff, 0xfeff],
];

const PROHIBITED: Ranges = [
  ...NON_ASCII_SPACE, // C.1.2
  [0x0000, 0x001f],
  [0x007f, 0x007f], // C.2.1 ASCII control
  [0x0080, 0x009f],
  [0x06dd, 0x06dd],
  [0x070f, 0x070f],
  [0x180e, 0x180e],
  [0x200c, 0x200d],
  [0x2028, 0x2029],
  [0x2060, 0x2063],
  [0x206a, 0x206f],
  [0xfeff, 0xfeff],
  [0xfff9, 0xfffc],
  [0x1d173, 0x1d17a], // C.2.2 non-ASCII control
  [0xe000, 0xf8ff],
  [0xf0000, 0xffffd],
  [0x100000, 0x10fffd], // C.3 private use
  [0xfdd0, 0xfdef],
  ...Array.from({ length: 17 }, (_, plane) => [plane * 0x10000 + 0xfffe, plane * 0x10000 + 0xffff] as const), // C.4 non-characters
  [0xd800, 0xdfff], // C.5 surrogates
  [0xfff9, 0xfffd], // C.6 inappropriate for plain text
  [0x2ff0, 0x2ffb], // C.7 inappropriate for canonical representation
  [0x0340, 0x0341],
  [0x200e, 0x200f],
  [0x202a, 0x202e], // C.8 change display properties (206A–206F above)
  [0xe0001, 0xe0001],
  [0xe0020, 0xe007f], // C.9 tagging
];

/** D.1: characters with bidirectional property R or AL. */
const RAND_AL_CAT: Ranges = [
  [0x05be, 0x05be],
  [0x05c0, 0x05c0],
  [0x05c3, 0x05c3],
  [0x05d0, 0x05ea],
  [0x05f0, 0x05f4],
  [0x061b, 0x061b],
  [0x061f, 0x061f],
  [0x0621, 0x063a],
  [0x0640, 0x064a],
  [0x066d, 0x066f],
  [0x0671, 0x06d5],
  [0x06dd, 0x06dd],
  [0x06e5, 0x06e6],
  [0x06fa, 0x06fe],
  [0x0700, 0x070d],
  [0x0710, 0x0710],
  [0x0712, 0x072c],
  [0x0780, 0x07a5],
  [0x07b1, 0x07b1],
  [0x200f, 0x200f],
  [0xfb1d, 0xfb1d],
  [0xfb1f, 0xfb28],
  [0xfb2a, 0xfb36],
  [0xfb38, 0xfb3c],
  [0xfb3e, 0xfb3e],
  [0xfb40, 0xfb41],
  [0xfb43, 0xfb44],
  [0xfb46, 0xfbb1],
  [0xfbd3, 0xfd3d],
  [0xfd50, 0xfd8f],
  [0xfd92, 0xfdc7],
  [0xfdf0, 0xfdfc],
  [0xfe70, 0xfe74],
  [0xfe76, 0xfefc],
];

const within = (table: Ranges, cp: number) => table.some(([lo, hi]) => cp >= lo && cp <= hi);

/**
 * D.2 (property L) is some 360 ranges; a letter or spacing mark that is not R/AL stands in for it
 * (what the bidi rule needs: no left-to-right letters in right-to-left text).
 */
const isLCat = (ch: string, cp: number) => !within(RAND_AL_CAT, cp) && /[\p{L}\p{Mc}]/u.test(ch);

export class SaslprepError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SaslprepError';
  }
}

/** The password prepared by RFC 4013; throws SaslprepError where the RFC refuses it. */
export function saslprep(password: string): string {
  let mapped = '';
  for (const ch of password) {
    const cp = ch.codePointAt(0)!;
    if (within(NON_ASCII_SPACE, cp)) mapped += ' ';
    else if (!within(MAPPED_TO_NOTHING, cp)) mapped += ch;
  }
  const normalized = mapped.normalize('NFKC');
  const chars = [...normalized];
  for (const ch of chars)
    if (within(PROHIBITED, ch.codePointAt(0)!))
      throw new SaslprepError(`prohibited character U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`);
  if (chars.some((ch) => within(RAND_AL_CAT, ch.codePointAt(0)!))) {
    if (chars.some((ch) => isLCat(ch, ch.codePointAt(0)!))) throw new SaslprepError('right-to-left text with left-to-right characters');
    if (!within(RAND_AL_CAT, chars[0]!.codePointAt(0)!) || !within(RAND_AL_CAT, chars.at(-1)!.codePointAt(0)!))
      throw new SaslprepError('right-to-left text must start and end with a right-to-left character');
  }
  return normalized;
}

/** The prepared password, or the password itself where SASLprep refuses it (as Postgres and libpq do). */
export function saslprepOrRaw(password: string): string {
  try {
    return saslprep(password);
  } catch (err) {
    if (err instanceof SaslprepError) return password;
    throw err;
  }
}
