// fencepost ops dashboard: polls the proxy's JSON endpoints and redraws. Plain browser
// JavaScript, no dependencies, no build step. Every value from the API is written with
// textContent (keys and writer ids are user data, never HTML).
'use strict';

(() => {
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = Math.max(250, Number(params.get('refreshMs')) || 2000);
  const MINUTES = Math.min(1440, Math.max(5, Number(params.get('minutes')) || 60));
  const SVG = 'http://www.w3.org/2000/svg';
  const fmt = new Intl.NumberFormat('en-US');
  const seen = new Set(); // rejection ids already shown, to highlight new ones
  const KEY_STORAGE = 'fencepost.readKey';
  let first = true;

  const $ = (id) => document.getElementById(id);

  async function getJson(path) {
    const headers = { accept: 'application/json' };
    const key = sessionStorage.getItem(KEY_STORAGE);
    if (key) headers.authorization = `Bearer ${key}`;
    const res = await fetch(path, { headers, cache: 'no-store', credentials: 'same-origin' });
    // A poll sent before a key was given (or changed) answers for the old key: it must not ask again.
    const current = sessionStorage.getItem(KEY_STORAGE) === key;
    if (current && (res.status === 401 || (res.status === 403 && key))) $('key-form').hidden = false;
    if (!res.ok) {
      let code = `HTTP ${res.status}`;
      try { code = (await res.json()).error || code; } catch { /* not JSON */ }
      throw new Error(`${path.split('?')[0]}: ${code}`);
    }
    return await res.json();
  }

  function setNumber(id, n) {
    const el = $(id);
    el.dataset.value = String(n);
    el.textContent = fmt.format(n);
  }

  function cell(tr, text, cls) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function renderTotals(stats, hist) {
    setNumber('total-rejected', stats.rejected);
    setNumber('total-accepted', stats.accepted);
    setNumber('fence-count', stats.fenceCount);
    const all = stats.accepted + stats.rejected;
    $('rejection-ratio').textContent = all === 0 ? '–' : `${((100 * stats.rejected) / all).toFixed(stats.rejected === 0 ? 0 : 2)} %`;
    const recent = hist.buckets.slice(-5).reduce((s, b) => s + b.count, 0);
    setNumber('recent-rejected', recent);
  }

  function renderFences(stats) {
    const tbody = $('fences').tBodies[0];
    tbody.replaceChildren();
    for (const f of stats.byFenceKey) {
      const tr = document.createElement('tr');
      tr.dataset.fenceKey = f.fenceKey;
      const key = cell(tr, f.fenceKey, 'key');
      key.title = f.fenceKey;
      cell(tr, f.highestToken, 'num highest-token');
      // The writer that raised the fence to its highest token: who holds the fence now.
      cell(tr, f.raisedBy ?? '—', f.raisedBy ? 'raised-by' : 'raised-by muted').title = f.raisedBy ?? 'no Writer-Id sent';
      cell(tr, `${age(f.raisedAt)} ago`, 'raised-at muted').title = f.raisedAt;
      cell(tr, fmt.format(f.accepted), 'num accepted');
      cell(tr, fmt.format(f.rejected), f.rejected > 0 ? 'num rejected bad' : 'num rejected muted');
      tbody.appendChild(tr);
    }
    $('fences-empty').hidden = stats.byFenceKey.length > 0;
  }

  /** "4 s", "3 min", "2 h 5 min", "3 d": how long ago `iso` was, by this browser's clock. */
  function age(iso) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d`;
  }

  // A leader whose fence is still below its token this long after it took over is one whose fence
  // advance keeps failing: it leads in ZooKeeper but its writes are refused.
  const RAISE_GRACE_MS = params.has('raiseGraceMs') && Number(params.get('raiseGraceMs')) >= 0 ? Number(params.get('raiseGraceMs')) : 10_000;

  function renderElections(view) {
    const tbody = $('elections').tBodies[0];
    tbody.replaceChildren();
    const note = $('elections-note');
    if (view.error) {
      note.textContent = `cannot read the elections: ${view.error}`;
      note.hidden = false;
      return;
    }
    if (!view.guard) {
      note.textContent = 'No election paths are mapped to fence keys here (FENCEPOST_FORGERY_GUARD). Who holds each fence, and since when, is in Fences below.';
      note.hidden = false;
      return;
    }
    note.hidden = true;
    for (const e of view.elections) {
      const tr = document.createElement('tr');
      tr.dataset.electionPath = e.electionPath;
      cell(tr, e.electionPath, 'key').title = e.electionPath;
      cell(tr, `${e.fenceKeyPrefix}…`, 'key');
      let state, cls;
      if (e.leader === null) {
        cell(tr, '—', 'leader-id muted');
        cell(tr, '—', 'num leader-token muted');
        cell(tr, '—', 'muted');
        [state, cls] = e.untrusted ? [`not trusted: ${e.untrusted}`, 'fence-state bad'] : ['nobody leads', 'fence-state bad'];
      } else {
        cell(tr, e.leader.id ?? '—', e.leader.id ? 'key leader-id' : 'leader-id muted').title = e.leader.id ?? 'the leader wrote no id into its node';
        cell(tr, e.leader.token, 'num leader-token');
        // A leader raises its fence as it takes over: then the raise dates its leadership. Until then,
        // what this proxy saw is a lower bound ("≥").
        const atToken = e.fence !== null && e.fence.highestToken === e.leader.token;
        const since = atToken ? e.fence.raisedAt : e.leader.seenSince;
        cell(tr, `${atToken ? '' : '≥ '}${age(since)}`, 'leading-for').title = `queued since ${e.leader.joinedAt}`;
        const waited = Date.now() - Date.parse(e.leader.seenSince);
        if (e.fenceRaised) [state, cls] = ['raised', 'fence-state good'];
        else if (waited < RAISE_GRACE_MS) [state, cls] = ['raising…', 'fence-state muted'];
        else [state, cls] = [`not raised for ≥ ${age(e.leader.seenSince)}`, 'fence-state bad'];
      }
      cell(tr, fmt.format(e.candidates), 'num candidates');
      cell(tr, e.fence ? e.fence.highestToken : '—', e.fence ? 'num fence-token' : 'num fence-token muted').title = e.fence ? e.fence.fenceKey : 'no fence under this prefix yet';
      const st = cell(tr, state, cls);
      st.dataset.state = e.leader === null ? 'leaderless' : e.fenceRaised ? 'raised' : 'behind';
      tbody.appendChild(tr);
    }
    if (view.elections.length === 0) {
      note.textContent = 'No elections mapped.';
      note.hidden = false;
    }
  }

  function renderRejections(page) {
    const tbody = $('rejections').tBodies[0];
    tbody.replaceChildren();
    for (const r of page.rejections) {
      const tr = document.createElement('tr');
      tr.dataset.id = r.id;
      if (!first && !seen.has(r.id)) tr.className = 'fresh';
      seen.add(r.id);
      const t = new Date(r.rejectedAt);
      cell(tr, t.toLocaleTimeString([], { hour12: false }), 'muted').title = t.toISOString();
      cell(tr, r.fenceKey, 'key').title = r.fenceKey;
      cell(tr, r.objectKey ?? '—', 'key');
      cell(tr, r.operation);
      cell(tr, r.door, 'door'); // http, transaction or sql: which door refused it
      cell(tr, r.token, 'num bad');
      cell(tr, r.highestToken, 'num');
      cell(tr, r.writerId ?? '—', r.writerId ? '' : 'muted');
      tbody.appendChild(tr);
    }
    $('rejections-empty').hidden = page.rejections.length > 0;
  }

  function svg(tag, attrs, parent) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    parent.appendChild(el);
    return el;
  }

  /** Smallest "nice" number (1, 2, 5 × 10^n) at or above n. */
  function niceCeil(n) {
    if (n <= 4) return 4;
    const p = 10 ** Math.floor(Math.log10(n));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= n) return m * p;
    return 10 * p;
  }

  function renderChart(hist) {
    const chart = $('chart');
    chart.replaceChildren();
    const W = 960, H = 220, left = 40, right = 8, top = 10, bottom = 24;
    const buckets = hist.buckets;
    const max = niceCeil(Math.max(0, ...buckets.map((b) => b.count)));
    const plotW = W - left - right, plotH = H - top - bottom;
    for (let i = 0; i <= 4; i++) {
      const y = top + plotH - (plotH * i) / 4;
      svg('line', { class: 'grid', x1: left, x2: W - right, y1: y, y2: y }, chart);
      svg('text', { x: left - 6, y: y + 4, 'text-anchor': 'end' }, chart).textContent = fmt.format((max * i) / 4);
    }
    const step = plotW / Math.max(1, buckets.length);
    const barW = Math.max(1, step * 0.72);
    buckets.forEach((b, i) => {
      const h = b.count === 0 ? 1.5 : Math.max(2, (plotH * b.count) / max);
      const x = left + i * step + (step - barW) / 2;
      const bar = svg('rect', { class: b.count === 0 ? 'bar zero' : 'bar', x, y: top + plotH - h, width: barW, height: h, 'data-count': b.count }, chart);
      const start = new Date(b.start);
      svg('title', {}, bar).textContent = `${start.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false })}: ${b.count} rejected`;
      const every = buckets.length > 30 ? 10 : 5;
      if (start.getMinutes() % every === 0) {
        svg('text', { x: x + barW / 2, y: H - 6, 'text-anchor': 'middle' }, chart).textContent = start.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });
      }
    });
    $('chart-range').textContent = `last ${buckets.length} minutes, database time`;
  }

  function setStatus(state, text) {
    $('status').dataset.state = state;
    $('status-text').textContent = text;
  }

  async function refresh() {
    try {
      // The elections come from ZooKeeper: when it cannot answer, the panel says so and the rest stays live.
      const [stats, page, hist, elections] = await Promise.all([
        getJson('v1/stats?limit=25'),
        getJson('v1/rejections?limit=15'),
        getJson(`v1/rejections/histogram?minutes=${MINUTES}`),
        getJson('v1/elections').catch((err) => ({ error: err instanceof Error ? err.message : String(err) })),
      ]);
      renderTotals(stats, hist);
      renderElections(elections);
      renderFences(stats);
      renderRejections(page);
      renderChart(hist);
      first = false;
      setStatus('live', `live · updated ${new Date().toLocaleTimeString([], { hour12: false })} · every ${REFRESH_MS / 1000} s`);
    } catch (err) {
      setStatus('error', `not updating: ${err instanceof Error ? err.message : String(err)} (retrying)`);
    }
  }

  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const key = $('key-input').value.trim();
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    $('key-input').value = '';
    $('key-form').hidden = true;
    if (timer !== null) {
      clearTimeout(timer); // idle between polls: poll now (a poll in flight picks the key up next time)
      void loop();
    }
  });

  let timer = null;
  async function loop() {
    timer = null;
    if (!document.hidden) await refresh();
    timer = setTimeout(loop, REFRESH_MS);
  }
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && timer !== null) {
      clearTimeout(timer);
      void loop();
    }
  });
  void loop();
})();
