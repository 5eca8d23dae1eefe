// End-to-end tests of `poolsight html` in a real browser: Debian's Chromium driven by
// playwright-core (which never downloads a browser of its own). Run by
// scripts/browser-tests.sh, which builds the binary and names it in POOLSIGHT_BIN.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const root = resolve(import.meta.dirname, "..", "..");
const bin = process.env.POOLSIGHT_BIN || join(root, "target", "debug", "poolsight");
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
const fixture = (name) => join(root, "fixtures", "traces", name + ".pstrace");
const work = mkdtempSync(join(tmpdir(), "poolsight-browser-"));
let browser;

const poolsight = (...args) => execFileSync(bin, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

function report(traces, name) {
  const out = join(work, name + ".html");
  poolsight("html", ...traces, "-o", out);
  return out;
}

async function open(file) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("dialog", (d) => { errors.push("dialog: " + d.message()); d.dismiss(); });
  // Nothing may be fetched: the page is self-contained.
  await page.route((url) => !url.href.startsWith("file:"), (r) => { errors.push("request: " + r.request().url()); r.abort(); });
  await page.goto("file://" + file);
  await page.waitForSelector("body[data-ready='1']", { timeout: 10000 });
  return { page, errors };
}

before(async () => {
  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
});

after(async () => {
  if (browser) await browser.close();
  rmSync(work, { recursive: true, force: true });
});

// The stacks live at the pool's peak as `poolsight export --format folded --metric peak`
// gives them: innermost frame label -> bytes.
function liveAtPeak(trace) {
  const out = poolsight("export", "--format", "folded", "--metric", "peak", "-o", "-", trace);
  return out.trim().split("\n").map((l) => {
    const at = l.lastIndexOf(" ");
    const frames = l.slice(0, at).replace(/\u00a0/g, " ").split(";");
    return { leaf: frames[frames.length - 1], stack: frames.join(" \u2192 "), bytes: Number(l.slice(at + 1)) };
  });
}

test("the timeline's peak is info's peak, and hovering a band names its stack", async () => {
  const trace = fixture("chainer_nested");
  const info = JSON.parse(poolsight("info", "--format", "json", trace));
  const { page, errors } = await open(report([trace], "chainer"));
  const canvas = page.locator("canvas.timeline").first();
  assert.equal(Number(await canvas.getAttribute("data-peak-bytes")), info.pool.peak_used_bytes, "the drawn stack's top");
  assert.match(await page.textContent("#summary"), /peak used 8\.00MB/);

  // The band of the largest stack at the peak point.
  const { x, y, name } = await page.evaluate(() => {
    const t = window.poolsight.timelines()[0], run = t.runs[0];
    let i = 0;
    run.used.forEach((u, k) => { if (u > run.used[i]) i = k; });
    const c = t.bandCenter(i, 0);
    const stacks = run.bands.find((b) => b.by === "stack");
    return { ...c, name: stacks.names[stacks.top[0]] };
  });
  await page.mouse.move(x, y);
  const tip = await page.textContent("#tooltip");
  assert.ok(await page.isVisible("#tooltip"), "a tooltip shows");
  assert.ok(tip.startsWith(name + "\n"), `tooltip names the stack: ${tip}`);
  assert.match(tip, /6\.00MB live/);
  assert.deepEqual(errors, []);
  await page.close();
});

test("clicking the peak instant shows the live-at-peak stacks with their bytes", async () => {
  const trace = fixture("chainer_nested");
  const { page, errors } = await open(report([trace], "chainer-click"));
  await page.click("#zoom-reset");
  // Click an early instant first, then the peak's band: the view follows the click.
  const at = await page.evaluate(() => {
    const t = window.poolsight.timelines()[0], run = t.runs[0];
    let i = 0;
    run.used.forEach((u, k) => { if (u > run.used[i]) i = k; });
    return t.bandCenter(i, 0);
  });
  const early = await page.evaluate(() => {
    // The widest-lasting point below the peak, so the click cannot land on a neighbour.
    const t = window.poolsight.timelines()[0], run = t.runs[0];
    let i = -1;
    const span = (k) => (k + 1 < run.t.length ? run.t[k + 1] - run.t[k] : 0);
    run.used.forEach((u, k) => {
      if (u < run.peak_used_bytes && (i < 0 || span(k) > span(i))) i = k;
    });
    return t.bandCenter(i, 0).x;
  });
  const box = await page.locator("canvas.timeline").first().boundingBox();
  await page.mouse.click(early, box.y + box.height - 30);
  assert.doesNotMatch(await page.textContent("#live-title"), /the peak/, "an early instant");
  await page.mouse.click(at.x, at.y);
  assert.match(await page.textContent("#live-title"), /\(the peak\): 8\.00MB/);
  const rows = await page.$$eval("#live-table tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
  const want = liveAtPeak(trace);
  assert.equal(rows.length, want.length);
  for (const w of want) {
    const row = rows.find((r) => r[3] === w.stack);
    assert.ok(row, `stack ${w.stack} listed: ${JSON.stringify(rows)}`);
    // Its name: here its innermost frame, which tells every stack of this trace apart.
    assert.equal(row[0], w.leaf);
    assert.equal(Number(row[2].replace(/,/g, "")), w.bytes);
  }
  // Largest first.
  assert.equal(rows[0][1], "6.00MB");
  const flame = await page.$$eval("#live-flame .frame", (ds) => ds.map((d) => d.dataset.name));
  assert.ok(flame.some((n) => /^Inner \(tests\/scenarios\/mod\.rs:\d+\)$/.test(n)), flame.join(", "));
  assert.deepEqual(errors, []);
  await page.close();
});

// The legend's band names, without the "other" and "acquired" entries.
const legend = (page) => page.$$eval("#legend > span", (ss) => ss.map((s) => s.textContent)
  .filter((t) => !/^other |^acquired /.test(t)));

test("the stacking control stacks the timeline by category, module or stack, each band named once", async () => {
  const trace = fixture("torch/categories");
  const info = JSON.parse(poolsight("info", "--format", "json", trace));
  const categories = JSON.parse(poolsight("categories", "--format", "json", trace));
  const { page, errors } = await open(report([trace], "torch"));
  const offered = await page.$$eval("#stack-by button", (bs) => bs.map((b) => b.textContent));
  assert.deepEqual(offered, ["category", "module", "stack"]);
  const active = () => page.$eval("#stack-by button.active", (b) => b.textContent);
  const peak = () => page.locator("canvas.timeline").first().getAttribute("data-peak-bytes");
  assert.equal(await active(), "category", "by category when the trace has categories");
  assert.deepEqual((await legend(page)).sort(), categories.categories.map((c) => c.category).sort());
  assert.equal(Number(await peak()), info.pool.peak_used_bytes);
  assert.equal(await page.textContent("#live-table th"), "category");

  // Hovering the largest band at the peak names its category.
  const at = await page.evaluate(() => {
    const t = window.poolsight.timelines()[0], run = t.runs[0];
    let i = 0;
    run.used.forEach((u, k) => { if (u > run.used[i]) i = k; });
    const bs = run.bands.find((b) => b.by === "category");
    return { ...t.bandCenter(i, 0), name: bs.names[bs.top[0]] };
  });
  await page.mouse.move(at.x, at.y);
  assert.ok((await page.textContent("#tooltip")).startsWith(at.name + "\n"));
  assert.equal(at.name, "activation");

  for (const by of ["module", "stack"]) {
    await page.click(`#stack-by button[data-by=${by}]`);
    assert.equal(await active(), by);
    assert.equal(await page.getAttribute("#legend", "data-by"), by);
    const names = await legend(page);
    assert.ok(names.length >= 5, names.join(" | "));
    assert.equal(new Set(names).size, names.length, `no two bands alike: ${names.join(" | ")}`);
    for (const n of names) {
      assert.doesNotMatch(n, /\(:0\)/);
      // A module or function name and a short path lead (or a band outside every module).
      assert.match(n, /^(\(outside every module\)|[\w.:<> ]+ \([\w./<>]+:\d+\)|[\w.]+ \u203a )/, n);
    }
    assert.equal(Number(await peak()), info.pool.peak_used_bytes, `by ${by}: the drawn stack's top`);
    assert.equal(await page.textContent("#live-table th"), by);
  }
  const stacks = await legend(page);
  assert.ok(stacks.every((n) => /(^| \u203a )(activation|temporary|gradient|input|parameter|optimizer_state)$/.test(n)),
    stacks.join(" | "));
  assert.deepEqual(errors, []);
  await page.close();
});

test("the category section shows poolsight categories' figures, only for a trace with categories", async () => {
  const trace = fixture("torch/categories");
  const want = JSON.parse(poolsight("categories", "--format", "json", trace));
  const { page, errors } = await open(report([trace], "torch-categories"));
  assert.ok(await page.isVisible("#categories-section"));
  const bar = await page.$$eval("#category-peak span", (ss) => ss.map((s) => [s.dataset.category, Number(s.dataset.bytes)]));
  assert.deepEqual(bar, want.categories.map((c) => [c.category, c.at_peak_bytes]));
  assert.equal(Number(await page.getAttribute("#category-peak", "data-total-bytes")), want.peak_used_bytes);
  assert.equal(await page.locator("canvas.category-chart").count(), 1);
  const modules = await page.$$eval("#categories-section #modules-table tbody tr", (trs) => trs.map((tr) => tr.cells[0].textContent.trim()));
  assert.deepEqual(modules, want.modules.map((m) => m.module.split("/").pop()));
  assert.equal(await page.locator("#modules-table").count(), 1, "shown once, in the section");
  // Sizes read as the CLI prints them, ties to even included (12,416 bytes: 12.12KB).
  const cells = await page.$$eval("#categories-table tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
  const table = poolsight("categories", trace).split("\n").slice(1)
    .map((l) => l.trim().split(/\s+/)).filter((r) => want.categories.some((c) => c.category === r[0]));
  assert.deepEqual(cells.map((r) => [r[0], r[1], r[2], r[4]]), table);
  assert.deepEqual(errors, []);
  await page.close();

  const plain = await open(report([fixture("chainer_nested")], "chainer-categories"));
  assert.ok(await plain.page.isHidden("#categories-section"));
  assert.ok(await plain.page.isVisible("#stack-by"), "links: by module or by stack");
  assert.deepEqual(await plain.page.$$eval("#stack-by button", (bs) => bs.map((b) => b.textContent)), ["module", "stack"]);
  assert.deepEqual(plain.errors, []);
  await plain.page.close();
});

test("a snapshot without record_function ranges gets a phase view and a timeline by phase", async () => {
  const snap = join(root, "fixtures", "pytorch", "snapshot_step_cpp_plain.pickle");
  const want = JSON.parse(poolsight("categories", "--format", "json", snap)).phases;
  const { page, errors } = await open(report([snap], "phases"));
  assert.ok(await page.isVisible("#phases-section"));
  assert.match(await page.textContent("#phase-note"), /inferred from the stacks/);
  // One bar per phase, split by category with the bytes `poolsight categories` gives.
  const rows = await page.$$eval("#phase-peak .phase-row", (rs) => rs.map((r) => ({
    phase: r.dataset.phase,
    parts: [...r.querySelectorAll(".bar span")].map((s) => [s.dataset.category, Number(s.dataset.bytes)]),
  })));
  assert.deepEqual(rows, want.map((p) => ({ phase: p.phase, parts: p.categories.map((c) => [c.category, c.at_peak_bytes]) })));
  assert.ok(await page.isVisible("#phases-section #phases-table"), "the table sits in its section");
  assert.ok(await page.isHidden("#tables #phases-table"));
  // The timeline stacks by phase too; each point's bands still add up to its used bytes.
  assert.ok((await page.$$eval("#stack-by button", (bs) => bs.map((b) => b.textContent))).includes("phase"));
  await page.click("#stack-by button:text-is('phase')");
  const legend = await page.$$eval("#legend > span", (ss) => ss.map((s) => s.textContent));
  for (const p of ["forward", "backward", "optimizer step"]) assert.ok(legend.some((l) => l.startsWith(p)), legend.join(", "));
  const sums = await page.evaluate(() => {
    const run = window.poolsight.data.runs[0];
    const bs = run.bands.find((b) => b.by === "phase");
    return run.used.map((u, i) => [u, bs.live[i].filter((_, j) => j % 2 === 1).reduce((a, b) => a + b, 0) + bs.other[i]]);
  });
  for (const [used, sum] of sums) assert.equal(sum, used);
  assert.deepEqual(errors, []);
  await page.close();
});

test("searching the flamegraph highlights matching frames; clicking zooms", async () => {
  const { page, errors } = await open(report([fixture("chainer_nested")], "chainer-search"));
  await page.click("#metrics button[data-metric=used]");
  await page.fill("#search", "^Inner");
  await page.waitForSelector("#flame .frame.match");
  const matched = await page.$$eval("#flame .frame.match", (ds) => ds.map((d) => d.dataset.name));
  assert.ok(matched.length > 0 && matched.every((n) => n.startsWith("Inner")), matched.join(", "));
  assert.match(await page.textContent("#search-result"), /^matched 6\.00MB \(\d+\.\d%\)$/);
  const inner = page.locator("#flame .frame.match").first();
  await inner.click();
  const width = await inner.evaluate((d) => parseFloat(d.style.width));
  const full = await page.$eval("#flame", (f) => f.clientWidth);
  assert.ok(Math.abs(width - full) < 1, `zoomed frame fills the width (${width} of ${full})`);
  assert.deepEqual(errors, []);
  await page.close();
});

test("a table sorts by a column when its header is clicked", async () => {
  const { page, errors } = await open(report([fixture("chainer_nested")], "chainer-sort"));
  const header = page.locator("#functions-table th", { hasText: /^UsedBytes$/ });
  const names = () => page.$$eval("#functions-table tbody tr", (trs) => trs.map((tr) => tr.cells[0].textContent));
  assert.deepEqual(await names(), ["Inner", "Outer", "LinearFunction"], "first-seen order");
  await header.click();
  assert.equal(await header.getAttribute("aria-sort"), "descending");
  assert.deepEqual(await names(), ["Outer", "Inner", "LinearFunction"]);
  await header.click();
  assert.equal(await header.getAttribute("aria-sort"), "ascending");
  assert.deepEqual(await names(), ["LinearFunction", "Inner", "Outer"]);
  assert.deepEqual(errors, []);
  await page.close();
});

test("several ranks get a view selector", async () => {
  const { page, errors } = await open(report([fixture("two_ranks-rank0"), fixture("two_ranks-rank1")], "ranks"));
  const options = await page.$$eval("#rank option", (os) => os.map((o) => o.textContent));
  assert.equal(options.length, 3);
  assert.equal(options[0], "all ranks (merged)");
  assert.equal(await page.locator("canvas.timeline").count(), 2, "merged: one timeline per rank");
  await page.selectOption("#rank", "2");
  assert.equal(await page.locator("canvas.timeline").count(), 1);
  assert.match(options[2], /^rank 1 /);
  assert.deepEqual(errors, []);
  await page.close();
});

test("diff --html shows both runs on one axis and the differential flamegraph", async () => {
  const out = join(work, "diff.html");
  const base = fixture("chainer_nested"), nu = fixture("cupy_line_profile");
  try {
    poolsight("diff", base, nu, "--html", out);
  } catch (e) {
    if (e.status !== 1) throw e;
  }
  const { page, errors } = await open(out);
  assert.equal(await page.locator("canvas.timeline").count(), 1);
  const runTitle = await page.textContent(".run-title");
  assert.match(runTitle, /^base: .*vs.*new: /);
  // Each side named once.
  assert.doesNotMatch(runTitle, /base: base: |new: new: /);
  assert.match(await page.textContent("#flame-title"), /^Differential flamegraph/);
  assert.ok(await page.locator("#flame .frame").count() > 1);
  assert.deepEqual(errors, []);
  await page.close();
});

test("a screenshot of the report is not blank", async () => {
  const { page, errors } = await open(report([fixture("chainer_nested")], "chainer-shot"));
  const png = await page.screenshot({ fullPage: false });
  writeFileSync(join(work, "shot.png"), png);
  // Decode the PNG in the page itself and count the pixels that are not the background.
  const share = await page.evaluate(async (b64) => {
    const img = new Image();
    img.src = "data:image/png;base64," + b64;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width; c.height = img.height;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const px = g.getImageData(0, 0, c.width, c.height).data;
    const colors = new Set();
    let ink = 0;
    for (let i = 0; i < px.length; i += 4) {
      const v = (px[i] << 16) | (px[i + 1] << 8) | px[i + 2];
      if (v !== 0xfafafa && v !== 0xffffff) ink++;
      if (colors.size < 64) colors.add(v);
    }
    return { ink: ink / (px.length / 4), colors: colors.size };
  }, png.toString("base64"));
  assert.ok(share.ink > 0.1, `at least a tenth of the pixels drawn: ${JSON.stringify(share)}`);
  assert.ok(share.colors >= 16, `many colors: ${JSON.stringify(share)}`);
  assert.deepEqual(errors, []);
  await page.close();
});
