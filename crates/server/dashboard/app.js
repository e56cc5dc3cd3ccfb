// spate's live dashboard. It reads what machines read too: /metrics (Prometheus' text format),
// /health, /openapi.json (to know the enabled apps and which route is whose) and each app's JSON
// endpoints. It keeps the last minutes in memory and redraws every REFRESH_MS.
//
// Text that clients chose (board, member and participant names) reaches the page only through
// textContent, never as HTML.
'use strict';

const REFRESH_MS = 2000;
const HISTORY_MS = 5 * 60 * 1000;
/// Ski's days take several requests per resort: they refresh every few rounds, for at most this many.
const SKI_RESORTS_SHOWN_MAX = 10;
const SKI_REFRESH_ROUNDS = 5;
const SKI_DAYS_SHOWN = 7;
const SKI_SEASONS_LOOKED_AT_MAX = 3;
const COLORS = ['#2e6bd9', '#d9482e', '#12805c', '#b54708', '#7a3fd1', '#0e8ba8', '#c11574', '#4e5ba6'];

const page = {
  key: sessionStorage.getItem('spate-key'),
  routeApp: new Map(),
  apps: [],
  hasCluster: false,
  previous: null,
  rounds: 0,
  charts: [],
  board: null,
  boardSelect: null,
  skiDays: null,
};

// ---- fetching ----

/// The server wants a key (401), or one that may read its metrics (403 there): the page asks for one.
class Refused extends Error {}

/// Paths without which the page shows nothing: a key they refuse is the wrong key.
const CORE_PATHS = ['/metrics', '/health', '/openapi.json'];

async function fetchFrom(path, parse) {
  const headers = page.key ? { Authorization: `Bearer ${page.key}` } : {};
  const response = await fetch(path, { headers, cache: 'no-store' });
  if (response.status === 401 || (response.status === 403 && CORE_PATHS.includes(path))) {
    throw new Refused(`${path}: ${response.status}`);
  }
  if (response.status === 403) {
    throw new Error(`this key may not read ${path}`);
  }
  // /health answers 503 with the same body, saying why.
  if (!response.ok && !(path === '/health' && response.status === 503)) {
    throw new Error(`${path}: ${response.status} ${await response.text()}`);
  }
  return parse(response);
}

const getJson = (path) => fetchFrom(path, (r) => r.json());
const getText = (path) => fetchFrom(path, (r) => r.text());

// ---- Prometheus' text format ----

/// Every sample of `text`: { name, labels, value }.
function parseMetrics(text) {
  const samples = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const row of text.split('\n')) {
    if (row === '' || row.startsWith('#')) continue;
    const found = line.exec(row);
    if (!found) continue;
    const labels = {};
    for (const [, name, value] of (found[2] || '').matchAll(label)) {
      labels[name] = value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    samples.push({ name: found[1], labels, value: metricValue(found[3]) });
  }
  return samples;
}

/// A sample's value: a number, or `+Inf`, `-Inf` or `NaN` as the text format writes them.
function metricValue(text) {
  return { '+Inf': Infinity, '-Inf': -Infinity }[text] ?? Number(text);
}

/// The sum of `name`'s samples, grouped by what `group` returns for their labels (skipping `null`).
function sumBy(samples, name, group) {
  const sums = new Map();
  for (const s of samples) {
    if (s.name !== name) continue;
    const key = group(s.labels);
    if (key === null) continue;
    sums.set(key, (sums.get(key) || 0) + s.value);
  }
  return sums;
}

const total = (samples, name) => sumBy(samples, name, () => '').get('') || 0;

/// Per second between two scrapes, by group; counters that went back (a restart) count from 0.
function ratesBy(now, before, seconds, name, group) {
  const a = sumBy(now, name, group);
  const b = sumBy(before, name, group);
  const rates = new Map();
  for (const [key, value] of a) {
    const previous = b.get(key) || 0;
    rates.set(key, Math.max(0, value >= previous ? value - previous : value) / seconds);
  }
  return rates;
}

/// The `q` quantile of the observations between two scrapes of histogram `name`, by group, as
/// Prometheus' histogram_quantile estimates it (linear within a bucket).
function quantilesBy(now, before, name, q, group) {
  const buckets = (samples) => {
    const byGroup = new Map();
    for (const s of samples) {
      if (s.name !== `${name}_bucket`) continue;
      const key = group(s.labels);
      if (key === null) continue;
      const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
      const perLe = byGroup.get(key) || new Map();
      perLe.set(le, (perLe.get(le) || 0) + s.value);
      byGroup.set(key, perLe);
    }
    return byGroup;
  };
  const a = buckets(now);
  const b = buckets(before);
  const result = new Map();
  for (const [key, perLe] of a) {
    const earlier = b.get(key) || new Map();
    const cumulative = [...perLe.entries()]
      .sort((x, y) => x[0] - y[0])
      .map(([le, count]) => [le, count - (earlier.get(le) || 0)]);
    const count = cumulative.length ? cumulative[cumulative.length - 1][1] : 0;
    if (count <= 0) continue;
    const rank = q * count;
    let [lowLe, lowCount] = [0, 0];
    for (const [le, c] of cumulative) {
      if (c >= rank) {
        const value = le === Infinity ? lowLe : lowLe + (le - lowLe) * ((rank - lowCount) / ((c - lowCount) || 1));
        result.set(key, value);
        break;
      }
      [lowLe, lowCount] = [le, c];
    }
  }
  return result;
}

// ---- charts ----

/// A line chart of named series over the last HISTORY_MS, with a legend of each series' latest value.
class Chart {
  constructor(id, title, format) {
    this.id = id;
    this.format = format;
    this.series = new Map();
    const figure = document.createElement('figure');
    figure.id = `chart-${id}`;
    const caption = document.createElement('figcaption');
    caption.textContent = title;
    this.canvas = document.createElement('canvas');
    this.canvas.setAttribute('role', 'img');
    this.canvas.setAttribute('aria-label', `${title} over the last 5 minutes; the latest values are in the legend below`);
    this.legend = document.createElement('ul');
    this.legend.className = 'legend';
    figure.append(caption, this.canvas, this.legend);
    document.getElementById('charts').append(figure);
  }

  /// Adds a point per series at `time`; a series missing from `values` gets no point this round.
  add(time, values) {
    for (const [name, value] of values) {
      if (!Number.isFinite(value)) continue;
      const points = this.series.get(name) || [];
      points.push([time, value]);
      this.series.set(name, points);
    }
    for (const [name, points] of this.series) {
      while (points.length && points[0][0] < time - HISTORY_MS) points.shift();
      if (!points.length) this.series.delete(name);
    }
  }

  draw(time) {
    const ratio = window.devicePixelRatio || 1;
    const width = this.canvas.clientWidth * ratio;
    const height = this.canvas.clientHeight * ratio;
    this.canvas.width = width;
    this.canvas.height = height;
    const g = this.canvas.getContext('2d');
    g.clearRect(0, 0, width, height);
    let top = 0;
    for (const points of this.series.values()) for (const [, v] of points) top = Math.max(top, v);
    const scaled = top > 0;
    top = scaled ? top * 1.1 : 1;
    const pad = 4 * ratio;
    const x = (t) => pad + ((t - (time - HISTORY_MS)) / HISTORY_MS) * (width - 2 * pad);
    const y = (v) => height - pad - (v / top) * (height - 2 * pad);
    g.strokeStyle = '#d0d5dd';
    g.lineWidth = ratio;
    g.beginPath();
    g.moveTo(pad, height - pad);
    g.lineTo(width - pad, height - pad);
    g.stroke();
    g.fillStyle = '#667085';
    g.font = `${11 * ratio}px system-ui, sans-serif`;
    if (scaled) g.fillText(this.format(top), pad, 12 * ratio);
    g.fillText('-5 min', pad, height - 2 * pad);
    g.textAlign = 'right';
    g.fillText('now', width - pad, height - 2 * pad);
    g.textAlign = 'left';
    this.legend.replaceChildren();
    [...this.series.keys()].sort().forEach((name, i) => {
      const points = this.series.get(name);
      const color = COLORS[i % COLORS.length];
      g.strokeStyle = color;
      g.lineWidth = 1.5 * ratio;
      g.beginPath();
      points.forEach(([t, v], j) => (j ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
      g.stroke();
      const item = document.createElement('li');
      const swatch = document.createElement('i');
      swatch.style.background = color;
      const latest = points[points.length - 1][1];
      const value = document.createElement('span');
      value.dataset.series = name;
      value.dataset.value = String(latest);
      value.textContent = this.format(latest);
      item.append(swatch, `${name} `, value);
      this.legend.append(item);
    });
  }
}

const perSecond = (v) => `${formatNumber(v)}/s`;
const milliseconds = (v) => `${(v * 1000).toPrecision(3)} ms`;
const plain = (v) => formatNumber(v);

function formatNumber(v) {
  if (!Number.isFinite(v)) return '-';
  if (Math.abs(v) >= 100 || Number.isInteger(v)) return Math.round(v).toLocaleString('en-US');
  return v.toPrecision(3);
}

// ---- what each round computes from two scrapes ----

const TOTALS = [
  ['requests', 'HTTP requests answered', (m) => total(m, 'spate_http_request_seconds_count')],
  ['commands_applied', 'commands applied', (m) => total(m, 'spate_commands_applied_total')],
  ['errors', 'HTTP errors', (m) => total(m, 'spate_http_errors_total')],
  ['journal_bytes', 'journal bytes', (m) => total(m, 'spate_journal_bytes_total')],
];

function appOfRoute(labels) {
  const app = page.routeApp.get(labels.route);
  return app === undefined || app === 'server' ? null : app;
}

const byPartition = (labels) => `p${labels.partition}`;

/// Each chart: its id, title, unit, what it shows of two scrapes taken `seconds` apart, and the app it
/// needs, if any.
const CHARTS = [
  ['throughput', 'Requests per second, by app', perSecond,
    (now, before, seconds) => ratesBy(now, before, seconds, 'spate_http_request_seconds_count', appOfRoute)],
  ['fraud-scored', 'fraud: transactions scored per second (HTTP and stream)', perSecond,
    (now, before, seconds) => ratesBy(now, before, seconds, 'spate_fraud_transactions_scored_total', () => 'scored'), 'fraud'],
  ['latency-p99', 'Latency p99, by app', milliseconds,
    (now, before) => quantilesBy(now, before, 'spate_http_request_seconds', 0.99, appOfRoute)],
  ['latency-p50', 'Latency p50, by app', milliseconds,
    (now, before) => quantilesBy(now, before, 'spate_http_request_seconds', 0.5, appOfRoute)],
  ['queue-depth', 'Requests waiting, by partition', plain,
    (now) => sumBy(now, 'spate_queue_depth', byPartition)],
  ['group-commit', 'Records per group commit (mean), by partition', plain, (now, before, seconds) => {
    const records = ratesBy(now, before, seconds, 'spate_journal_batch_records_sum', byPartition);
    const commits = ratesBy(now, before, seconds, 'spate_journal_batch_records_count', byPartition);
    return new Map([...commits].filter(([, c]) => c > 0).map(([p, c]) => [p, records.get(p) / c]));
  }],
  ['fsync', 'Group commit write + fsync p99, by partition', milliseconds,
    (now, before) => quantilesBy(now, before, 'spate_journal_commit_seconds', 0.99, byPartition)],
  ['pauses', 'Longest apply pause since start, by cause', milliseconds,
    (now) => {
      const longest = new Map();
      for (const s of now) {
        if (s.name !== 'spate_apply_pause_max_seconds') continue;
        longest.set(s.labels.cause, Math.max(longest.get(s.labels.cause) || 0, s.value));
      }
      return longest;
    }],
  ['lag', 'Read model lag (records), by app', plain,
    (now) => sumBy(now, 'spate_projection_lag_records', (l) => l.app)],
  ['errors', 'Errors per second, by status', perSecond,
    (now, before, seconds) => ratesBy(now, before, seconds, 'spate_http_errors_total', (l) => l.status)],
];

// ---- the app panels ----

function panel(id, title) {
  let section = document.getElementById(`app-${id}`);
  if (!section) {
    section = document.createElement('section');
    section.id = `app-${id}`;
    section.className = 'panel';
    const heading = document.createElement('h2');
    heading.textContent = title;
    const body = document.createElement('div');
    body.className = 'body';
    section.append(heading, body);
    document.getElementById('apps').append(section);
  }
  return section.querySelector('.body');
}

function facts(pairs) {
  const div = document.createElement('div');
  div.className = 'facts';
  for (const [name, value, key] of pairs) {
    const span = document.createElement('span');
    const b = document.createElement('b');
    b.textContent = typeof value === 'number' ? formatNumber(value) : String(value);
    if (key) {
      b.dataset.fact = key;
      b.dataset.value = String(value);
    }
    span.append(`${name} `, b);
    div.append(span);
  }
  return div;
}

/// A table of `rows` (arrays of cells); numeric cells are right-aligned.
function table(headings, rows) {
  const t = document.createElement('table');
  const head = t.createTHead().insertRow();
  headings.forEach((h, i) => {
    const th = document.createElement('th');
    th.textContent = h;
    if (i > 0) th.className = 'n';
    head.append(th);
  });
  const body = t.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    row.forEach((cell, i) => {
      const td = tr.insertCell();
      td.textContent = typeof cell === 'number' ? formatNumber(cell) : String(cell);
      if (i > 0) td.className = 'n';
    });
  }
  return t;
}

const APP_PANELS = {
  async tally() {
    const totals = await getJson('/tally/totals');
    panel('tally', 'tally').replaceChildren(facts([
      ['entries', totals.entries, 'tally-entries'],
      ['sum of balances', totals.balance_sum],
      ['read model lag', `${totals.lag_records} records`],
    ]));
  },

  async fraud() {
    const stats = await getJson('/fraud/stats');
    const rate = stats.scored ? (100 * stats.flagged) / stats.scored : 0;
    const rules = Object.entries(stats.flagged_by_rule).sort((a, b) => b[1] - a[1]).slice(0, 10);
    panel('fraud', 'fraud').replaceChildren(
      facts([
        ['scored', stats.scored, 'fraud-scored'],
        ['flagged', stats.flagged, 'fraud-flagged'],
        ['flagged rate', `${rate.toFixed(2)} %`],
        ['cards', stats.cards],
        ['stored transactions', stats.stored_transactions],
      ]),
      rules.length ? table(['rule', 'hits'], rules) : document.createTextNode('No rule has flagged a transaction.'),
    );
  },

  async ledger() {
    const ledger = await getJson('/participants');
    const rows = ledger.participants.map((p) => [p.name, p.currency, p.position, p.reserved, p.ndc]);
    const body = panel('ledger', 'ledger');
    const states = Object.entries(ledger.transfers).map(([state, n]) => [state.toLowerCase(), n, `ledger-${state.toLowerCase()}`]);
    body.replaceChildren(
      facts([...states, ['read model lag', `${ledger.lagRecords} records`]]),
      rows.length ? table(['participant', 'currency', 'position', 'reserved', 'net debit cap'], rows) : document.createTextNode('No participant yet.'),
    );
  },

  async leaderboard() {
    const { boards } = await getJson('/leaderboards');
    const body = panel('leaderboard', 'leaderboard');
    if (!boards.length) {
      body.replaceChildren('No board yet.');
      return;
    }
    if (!boards.some((b) => b.name === page.board)) page.board = boards[0].name;
    // One list for the page's life, its options replaced only when the boards change: rebuilt every
    // round, it would close while someone is choosing.
    if (!page.boardSelect) {
      page.boardSelect = document.createElement('select');
      page.boardSelect.setAttribute('aria-label', 'board');
      page.boardSelect.addEventListener('change', () => {
        page.board = page.boardSelect.value;
      });
    }
    const select = page.boardSelect;
    const names = boards.map((b) => b.name);
    if (JSON.stringify([...select.options].map((o) => o.value)) !== JSON.stringify(names)) {
      select.replaceChildren(...names.map((name) => new Option(name, name)));
    }
    select.value = page.board;
    const board = boards.find((b) => b.name === page.board);
    const top = await getJson(`/leaderboards/${encodeURIComponent(page.board)}/top?limit=10`);
    body.replaceChildren(
      select,
      facts([['members', board.members]]),
      table(['member', 'rank', 'score'], top.entries.map((e) => [e.member, e.rank, e.score])),
    );
  },

  async ski() {
    const lag = await getJson('/ski/lag');
    if (!page.skiDays || page.rounds % SKI_REFRESH_ROUNDS === 0) page.skiDays = await skiDays();
    panel('ski', 'ski').replaceChildren(
      facts([['rides', lag.rides, 'ski-rides'], ['read model lag', `${lag.lagRecords} records`]]),
      page.skiDays.length
        ? table(['resort', 'season', 'day', 'skiers'], page.skiDays)
        : document.createTextNode('No rides yet.'),
    );
  },

  async payments() {
    const summary = await getJson('/v1/payments/summary');
    panel('payments', 'payments').replaceChildren(
      facts([['captures to settle', summary.captures_to_settle, 'payments-to-settle']]),
      table(['status', 'payments'], Object.entries(summary.by_status)),
    );
  },
};

/// The last days with rides at each resort in its latest season: [resort, season, day, skiers].
async function skiDays() {
  const { resorts } = await getJson('/resorts');
  const rows = [];
  for (const resort of resorts.slice(0, SKI_RESORTS_SHOWN_MAX)) {
    const { seasons } = await getJson(`/resorts/${resort.resortID}/seasons`);
    // The newest season with rides: a season may be added before anyone rides in it.
    for (const season of seasons.map(Number).sort((a, b) => b - a).slice(0, SKI_SEASONS_LOOKED_AT_MAX)) {
      const { days } = await getJson(`/resorts/${resort.resortID}/seasons/${season}/days`);
      if (!days.length) continue;
      for (const day of days.slice(-SKI_DAYS_SHOWN)) rows.push([resort.resortName, String(season), String(day.dayID), day.numSkiers]);
      break;
    }
  }
  return rows;
}

async function showCluster() {
  const cluster = await getJson('/cluster');
  const section = document.getElementById('cluster');
  section.hidden = false;
  section.querySelector('.body').replaceChildren(
    facts([['this node', cluster.node_id], ['partitions', cluster.partitions], ['unowned', cluster.partitions_unowned]]),
    table(['node', 'address', 'partitions'], cluster.nodes.map((n) => [String(n.node_id), n.address, n.partitions.join(' ')])),
  );
}

// ---- the round ----

function showHealth(health) {
  const badge = document.getElementById('health');
  badge.textContent = `${health.status}, ${health.partitions} partitions, ${formatNumber(health.disk.free_bytes / 2 ** 30)} GiB free`;
  badge.className = `badge ${health.status === 'ok' ? 'ok' : 'bad'}`;
}

function showTotals(samples) {
  const section = document.getElementById('totals');
  section.replaceChildren(...TOTALS.map(([key, title, of]) => {
    const div = document.createElement('div');
    div.className = 'total';
    const value = of(samples);
    const b = document.createElement('b');
    b.dataset.total = key;
    b.dataset.value = String(value);
    b.textContent = formatNumber(value);
    div.append(b, title);
    return div;
  }));
}

function report(error) {
  const problem = document.getElementById('problem');
  if (error instanceof Refused) {
    document.getElementById('key-form').hidden = false;
    problem.textContent = page.key ? 'The key was refused.' : 'This server needs an API key.';
  } else {
    problem.textContent = String(error.message || error);
  }
}

async function round() {
  // Before the scrape: what the page shows is at least as new as this (the browser test relies on it).
  const time = Date.now();
  const [text, health] = await Promise.all([getText('/metrics'), getJson('/health')]);
  const samples = parseMetrics(text);
  showHealth(health);
  showTotals(samples);
  if (page.previous) {
    const seconds = (time - page.previous.time) / 1000;
    for (const chart of page.charts) chart.add(time, chart.compute(samples, page.previous.samples, seconds));
  }
  for (const chart of page.charts) chart.draw(time);
  page.previous = { time, samples };
  page.rounds += 1;
  const panels = page.apps.filter((app) => APP_PANELS[app]).map((app) => APP_PANELS[app]());
  if (page.hasCluster) panels.push(showCluster());
  const failed = (await Promise.allSettled(panels)).filter((p) => p.status === 'rejected');
  document.getElementById('updated').textContent = `updated ${new Date(time).toISOString()}`;
  document.body.dataset.rounds = String(page.rounds);
  document.body.dataset.scrapeStartedMs = String(time);
  // A panel that failed keeps what it showed; the others are new. A refused key asks for another.
  const refused = failed.find((p) => p.reason instanceof Refused);
  if (refused || failed.length) throw (refused || failed[0]).reason;
  document.getElementById('problem').textContent = '';
}

async function start() {
  const description = await getJson('/openapi.json');
  for (const [path, item] of Object.entries(description.paths)) {
    for (const operation of Object.values(item)) {
      const app = (operation.tags || [])[0];
      if (app) page.routeApp.set(path, app);
    }
  }
  page.apps = [...new Set(page.routeApp.values())].filter((app) => app !== 'server').sort();
  page.hasCluster = '/cluster' in description.paths;
  page.charts = CHARTS.filter(([, , , , app]) => !app || page.apps.includes(app))
    .map(([id, title, format, compute]) => Object.assign(new Chart(id, title, format), { compute }));
}

async function loop() {
  try {
    if (!page.charts.length) await start();
    await round();
  } catch (error) {
    report(error);
  }
  setTimeout(loop, REFRESH_MS);
}

document.getElementById('key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  page.key = document.getElementById('key').value.trim();
  sessionStorage.setItem('spate-key', page.key);
  document.getElementById('key-form').hidden = true;
});

loop();
