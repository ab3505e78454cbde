// The API reference page (GET /docs): the OpenAPI document (src/proxy/http/openapi.ts) rendered to one
// HTML page on the server. No script and nothing loaded from elsewhere, so it works offline and
// under a Content-Security-Policy that allows only its own inline style (by hash).
import { createHash } from 'node:crypto';
import { ERRORS, type ErrorCode } from '../errors.ts';

type Json = Record<string, unknown>;

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options'] as const;

const STYLE = `
body { font: 15px/1.5 system-ui, sans-serif; margin: 0; color: #1d232a; background: #fff; }
header, main, nav { max-width: 64rem; margin: 0 auto; padding: 0 1.5rem; }
header { padding-top: 1.5rem; }
nav ul { columns: 2; padding-left: 1.2rem; }
h2 { border-bottom: 1px solid #d5dbe1; margin-top: 2.5rem; }
article { border: 1px solid #d5dbe1; border-radius: 6px; padding: 0 1rem 0.5rem; margin: 1rem 0; }
h3 code, .method { font-size: 1rem; }
.method { display: inline-block; min-width: 4.2rem; font-weight: 700; text-transform: uppercase; }
.get { color: #116329; } .put { color: #7a4a00; } .post { color: #0b4f9c; } .delete { color: #a4161a; }
table { border-collapse: collapse; width: 100%; margin: 0.5rem 0; }
th, td { text-align: left; vertical-align: top; border-top: 1px solid #e6eaee; padding: 0.3rem 0.5rem; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.88em; }
pre { background: #f4f6f8; padding: 0.6rem; overflow-x: auto; }
.status { font-weight: 700; }
.muted { color: #5b6670; }
`;

/** The page's Content-Security-Policy: its one inline style, nothing else. */
export const REFERENCE_CSP = `default-src 'none'; style-src 'sha256-${createHash('sha256').update(STYLE).digest('base64')}'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`;

function esc(s: unknown): string {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** A line of the document's prose: `code` in backticks. */
function inline(text: unknown): string {
  return esc(text ?? '').replace(/`([^`]+)`/g, '<code>$1</code>');
}

/** The document's prose: paragraphs on blank lines. */
function prose(text: unknown): string {
  if (typeof text !== 'string' || text === '') return '';
  return text
    .split(/\n\s*\n/)
    .map((p) => `<p>${inline(p)}</p>`)
    .join('');
}

const obj = (v: unknown): Json => (typeof v === 'object' && v !== null ? (v as Json) : {});

/** A short line for a parameter's schema: its type and the rules on it. */
function schemaLine(schema: Json): string {
  const parts = [Array.isArray(schema.type) ? schema.type.join(' | ') : String(schema.type ?? 'any')];
  if (schema.format !== undefined) parts.push(`format ${String(schema.format)}`);
  if (schema.pattern !== undefined) parts.push(`pattern ${String(schema.pattern)}`);
  if (Array.isArray(schema.enum)) parts.push(`one of ${schema.enum.map((v) => JSON.stringify(v)).join(', ')}`);
  return `<code>${esc(parts.join('; '))}</code>`;
}

function parameters(op: Json): string {
  const params = Array.isArray(op.parameters) ? op.parameters.map(obj) : [];
  if (params.length === 0) return '';
  const rows = params.map(
    (p) =>
      `<tr><td><code>${esc(p.name)}</code></td><td>${esc(p.in)}</td><td>${p.required === true ? 'yes' : 'no'}</td><td>${schemaLine(obj(p.schema))}</td><td>${inline(p.description)}</td></tr>`,
  );
  return `<h4>Parameters</h4><table><tr><th>name</th><th>in</th><th>required</th><th>schema</th><th>description</th></tr>${rows.join('')}</table>`;
}

function content(c: unknown): string {
  return Object.entries(obj(c))
    .map(
      ([type, media]) =>
        `<details><summary><code>${esc(type)}</code></summary><pre>${esc(JSON.stringify(obj(media).schema ?? {}, null, 2))}</pre></details>`,
    )
    .join('');
}

function responses(op: Json): string {
  const rows = Object.entries(obj(op.responses)).map(([status, r]) => {
    const res = obj(r);
    const headers = Object.entries(obj(res.headers))
      .map(([name, h]) => `<li><code>${esc(name)}</code>: ${inline(obj(h).description)}</li>`)
      .join('');
    return `<tr><td class="status">${esc(status)}</td><td>${prose(res.description)}${headers === '' ? '' : `<ul class="muted">${headers}</ul>`}${content(res.content)}</td></tr>`;
  });
  return `<h4>Responses</h4><table>${rows.join('')}</table>`;
}

function anchor(method: string, path: string): string {
  return `${method}-${path.replace(/[^A-Za-z0-9]+/g, '-')}`;
}

function operation(method: string, path: string, op: Json): string {
  const security =
    Array.isArray(op.security) && op.security.length > 0
      ? '<p class="muted">Needs <code>Authorization: Bearer &lt;key&gt;</code>.</p>'
      : '';
  const body = op.requestBody === undefined ? '' : `<h4>Request body</h4>${content(obj(op.requestBody).content)}`;
  return `<article id="${anchor(method, path)}"><h3><span class="method ${method}">${method}</span> <code>${esc(path)}</code></h3>
${op.summary === undefined ? '' : `<p><strong>${esc(op.summary)}</strong></p>`}${prose(op.description)}${security}${parameters(op)}${body}${responses(op)}</article>`;
}

/** The whole page for an OpenAPI 3 document. */
export function renderReference(doc: Json): string {
  const info = obj(doc.info);
  const ops: { tag: string; method: string; path: string; op: Json }[] = [];
  for (const [path, item] of Object.entries(obj(doc.paths))) {
    for (const method of METHODS) {
      const op = obj(item)[method];
      if (op !== undefined) ops.push({ tag: String((obj(op).tags as string[] | undefined)?.[0] ?? 'other'), method, path, op: obj(op) });
    }
  }
  const tags = Array.isArray(doc.tags) ? doc.tags.map(obj) : [];
  const groups = tags.map((t) => ({ t, list: ops.filter((o) => o.tag === t.name) })).filter((g) => g.list.length > 0);
  const sections = groups.map(
    ({ t, list }) =>
      `<h2 id="tag-${esc(t.name)}">${esc(t.name)}</h2>${prose(t.description)}${list.map((o) => operation(o.method, o.path, o.op)).join('\n')}`,
  );
  const nav = groups
    .flatMap((g) => g.list)
    .map(
      (o) =>
        `<li><a href="#${anchor(o.method, o.path)}"><span class="method ${o.method}">${o.method}</span> <code>${esc(o.path)}</code></a></li>`,
    )
    .join('');
  const errors = (Object.keys(ERRORS) as ErrorCode[])
    .map((c) => `<tr><td><code>${c}</code></td><td>${ERRORS[c].status}</td><td>${prose(ERRORS[c].description)}</td></tr>`)
    .join('');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${esc(info.title)} API ${esc(info.version)}</title><style>${STYLE}</style></head>
<body><header><h1>${esc(info.title)} HTTP API <span class="muted">${esc(info.version)}</span></h1>
<p><a href="/openapi.json">openapi.json</a> (OpenAPI ${esc(doc.openapi)}) · <a href="/dashboard">live dashboard</a></p>${prose(info.description)}</header>
<nav><ul>${nav}</ul></nav>
<main>${sections.join('\n')}
<h2 id="errors">Errors</h2><p>Every error body is <code>{"error": code, "message": …}</code>; some codes add fields.</p>
<table><tr><th>code</th><th>status</th><th>when</th></tr>${errors}</table></main></body></html>
`;
}
