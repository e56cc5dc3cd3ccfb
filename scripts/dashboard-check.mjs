// Checks spate's dashboard in Debian's chromium, driven by playwright-core (scripts/browser-check.sh
// installs both). Exits non-zero, saying why, unless:
// - the page loads and refreshes by itself, with no console error, page error or failed request;
// - with SPATE_DASHBOARD_KEY set, it first asks for a key and then works with that one;
// - with SPATE_DASHBOARD_KEY_METRICS_ONLY=1 too (a key of the role `metrics`), its charts and totals
//   still refresh, it does not ask for another key, and it says which endpoint the key may not read;
// - each total it shows lies between two scrapes of /metrics taken around one of its refreshes;
// - the totals grow while the server is under load, and each app named shows more than
//   THROUGHPUT_UNDER_LOAD_MIN requests per second;
// - the facts the app panels show lie between two reads of the app's own endpoint, and each app named
//   has its panel (not with a metrics-only key);
// - on a cluster node, the nodes and the partitions each owns are those /cluster names.
// It then saves a screenshot of the whole page and prints what it saw as JSON.
// Usage: node dashboard-check.mjs BASE_URL SCREENSHOT_PNG [APP...]
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.SPATE_PLAYWRIGHT_DIR}/`);
const { chromium } = require('playwright-core');

const [base, screenshot, ...loadedApps] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error('usage: node dashboard-check.mjs BASE_URL SCREENSHOT_PNG [APP...]');
  process.exit(2);
}
const key = process.env.SPATE_DASHBOARD_KEY;
const metricsOnly = process.env.SPATE_DASHBOARD_KEY_METRICS_ONLY === '1';
/// What a metrics-only key may read; the page's other requests are refused 403 on purpose.
const METRICS_KEY_PATHS = ['/metrics', '/health', '/openapi.json', '/', '/dashboard/app.js', '/dashboard/style.css'];
const ROUND_TIMEOUT_MS = 20_000;

const headers = key ? { Authorization: `Bearer ${key}` } : {};
const fetchText = async (path) => {
  const response = await fetch(`${base}${path}`, { headers });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.text();
};
const fetchJson = async (path) => JSON.parse(await fetchText(path));

/// The sum of a metric's samples in Prometheus' text format.
function metricTotal(text, name) {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(' ').pop());
  }
  return sum;
}

/// Where each total on the page comes from.
const TOTALS = {
  requests: (text) => metricTotal(text, 'spate_http_request_seconds_count'),
  commands_applied: (text) => metricTotal(text, 'spate_commands_applied_total'),
  errors: (text) => metricTotal(text, 'spate_http_errors_total'),
  journal_bytes: (text) => metricTotal(text, 'spate_journal_bytes_total'),
};

/// Facts of the app panels, and the same number read from the app's endpoint.
const FACTS = {
  'tally-entries': ['tally', async () => (await fetchJson('/tally/totals')).entries],
  'ledger-committed': ['ledger', async () => (await fetchJson('/participants')).transfers.COMMITTED],
  'fraud-scored': ['fraud', async () => (await fetchJson('/fraud/stats')).scored],
  'ski-rides': ['ski', async () => (await fetchJson('/ski/lag')).rides],
};

const problems = [];
/// Set once the page sends its first request with a key: until then it is refused on purpose.
let keyGiven = false;
/// Requests per second an app under load must show: the page's own reads of an app's endpoints are a
/// few per second (ski's the most), and the tests' load is 50 or more per app.
const THROUGHPUT_UNDER_LOAD_MIN = 10;
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  // Root (as in CI) cannot use chromium's sandbox.
  args: process.getuid() === 0 ? ['--no-sandbox'] : [],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  // Without a key the page is refused, on purpose, and asks for one: the browser logs those 401s.
  const expectedRefusal = (status, url) => (key && status === 401 && !keyGiven)
    || (metricsOnly && status === 403 && (url === undefined || !METRICS_KEY_PATHS.includes(new URL(url).pathname)));
  page.on('request', (request) => {
    if (request.headers().authorization) keyGiven = true;
  });
  page.on('console', (message) => {
    const status = [401, 403].find((s) => message.text().includes(`status of ${s}`));
    if (message.type() === 'error' && !(status && expectedRefusal(status, message.location().url || undefined))) {
      problems.push(`console error: ${message.text()}`);
    }
  });
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  page.on('requestfailed', (request) => problems.push(`request failed: ${request.url()} ${request.failure()?.errorText}`));
  page.on('response', (response) => {
    if (response.status() >= 400 && !expectedRefusal(response.status(), response.url())) problems.push(`answer ${response.status()}: ${response.url()}`);
  });

  await page.goto(`${base}/`);
  if (key) {
    await page.locator('#key-form').waitFor({ state: 'visible', timeout: ROUND_TIMEOUT_MS });
    await page.fill('#key', key);
    await page.click('#key-form button');
  }
  const rounds = async () => Number((await page.getAttribute('body', 'data-rounds')) || 0);
  const nextRound = async () => {
    const after = await rounds();
    await page.waitForFunction((n) => Number(document.body.dataset.rounds || 0) > n, after, { timeout: ROUND_TIMEOUT_MS });
  };
  /// Until the page shows a round whose scrape began at `ms` or later (the page and this script read
  /// the same clock).
  const roundScrapedFrom = (ms) => page.waitForFunction(
    (t) => Number(document.body.dataset.scrapeStartedMs || 0) >= t,
    ms,
    { timeout: ROUND_TIMEOUT_MS },
  );
  const shown = (selector) => page.$$eval(selector, (nodes) => Object.fromEntries(nodes.map((n) => [n.dataset.total || n.dataset.fact || n.dataset.series, Number(n.dataset.value)])));

  // Two rounds make the first rates.
  await nextRound();
  await nextRound();
  const first = await shown('[data-total]');

  // Each total between two scrapes around one refresh: one whose scrape began after these reads.
  const before = await fetchText('/metrics');
  const factsBefore = {};
  for (const [fact, [app, read]] of Object.entries(FACTS)) if (loadedApps.includes(app) && !metricsOnly) factsBefore[fact] = await read();
  await roundScrapedFrom(Date.now());
  const totals = await shown('[data-total]');
  const facts = await shown('[data-fact]');
  const after = await fetchText('/metrics');
  for (const [name, of] of Object.entries(TOTALS)) {
    const [low, high, seen] = [of(before), of(after), totals[name]];
    if (!(low <= seen && seen <= high)) problems.push(`total ${name}: the page shows ${seen}, /metrics said ${low} then ${high}`);
  }
  for (const [fact, low] of Object.entries(factsBefore)) {
    const high = await FACTS[fact][1]();
    if (!(low <= facts[fact] && facts[fact] <= high)) problems.push(`${fact}: the page shows ${facts[fact]}, its endpoint said ${low} then ${high}`);
  }

  // Under load, the numbers move and every app named has throughput.
  for (const name of ['requests', 'commands_applied']) {
    if (!(totals[name] > first[name])) problems.push(`total ${name} did not move: ${first[name]} then ${totals[name]}`);
  }
  const throughput = await shown('#chart-throughput [data-series]');
  for (const app of loadedApps) {
    if (!(throughput[app] > THROUGHPUT_UNDER_LOAD_MIN)) problems.push(`no throughput under load shown for ${app}: ${JSON.stringify(throughput)}`);
  }
  const panels = await page.$$eval('#apps section', (sections) => sections.map((s) => s.id));
  if (metricsOnly) {
    const said = await page.textContent('#problem');
    if (!said.includes('may not read')) problems.push(`with a metrics-only key the page should say what it may not read; it says ${JSON.stringify(said)}`);
    if (await page.locator('#key-form').isVisible()) problems.push('with a metrics-only key the page asks for another key');
  } else {
    for (const app of loadedApps) if (!panels.includes(`app-${app}`)) problems.push(`no panel for ${app}: ${panels}`);
  }

  // A cluster node's page shows each node with the partitions /cluster says it owns. Owners may move
  // between the page's read and this one: a mismatch is looked at again after another round.
  let cluster = null;
  if ('/cluster' in (await fetchJson('/openapi.json')).paths) {
    const shownNodes = () => page.$$eval('#cluster tbody tr', (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
    const expected = async () => (await fetchJson('/cluster')).nodes.map((n) => [String(n.node_id), n.address, n.partitions.join(' ')]);
    let [seen, want] = [await shownNodes(), await expected()];
    for (let attempt = 0; attempt < 3 && JSON.stringify(seen) !== JSON.stringify(want); attempt += 1) {
      await nextRound();
      [seen, want] = [await shownNodes(), await expected()];
    }
    if (JSON.stringify(seen) !== JSON.stringify(want)) problems.push(`cluster: the page shows ${JSON.stringify(seen)}, /cluster says ${JSON.stringify(want)}`);
    cluster = seen;
  }

  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ rounds: await rounds(), totals, facts, throughput, panels, cluster, problems }));
} finally {
  await browser.close();
}
if (problems.length) {
  console.error(`dashboard-check: ${problems.length} problems:\n${problems.join('\n')}`);
  process.exit(1);
}
