// Screenshots of a report for the docs, and its time to interactive.
//   node tests/browser/screenshots.mjs demo.html docs/   # writes docs/html-{timeline,live,flamegraph}.png
//   node tests/browser/screenshots.mjs torch.html docs/  # a report with categories (of
//       fixtures/traces/torch/categories.pstrace): docs/html-categories{,-timeline}.png and
//       docs/html-torch-flamegraph.png
//   node tests/browser/screenshots.mjs big.html          # only prints the timings
//   node tests/browser/screenshots.mjs snap.html docs/ NAME  # a snapshot's page: docs/NAME.png (its
//       top), and when it has phases docs/NAME-phases.png (the timeline stacked by phase and the
//       phase view)
import { chromium } from "playwright-core";
import { resolve, join } from "node:path";
import { statSync } from "node:fs";

const [file, outDir, name] = process.argv.slice(2);
const path = resolve(file);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1200, height: 860 } });
const t0 = Date.now();
await page.goto("file://" + path);
await page.waitForSelector("body[data-ready='1']", { timeout: 60000 });
const wall = Date.now() - t0;
const ready = await page.evaluate(() => window.poolsightReadyMs);
console.log(`${file}: ${statSync(path).size} bytes; interactive ${ready.toFixed(0)} ms after navigation start (${wall} ms wall from goto)`);
const categories = await page.isVisible("#categories-section");
if (outDir && name) {
  await page.setViewportSize({ width: 1300, height: 1500 });
  await page.waitForTimeout(300);
  await page.screenshot({ path: join(outDir, name + ".png") });
  if (await page.isVisible("#phases-section")) {
    await page.click("#stack-by button:text-is('phase')");
    await page.waitForTimeout(200);
    const top = await page.locator("#timeline-section").boundingBox();
    await page.locator("#phases-section").scrollIntoViewIfNeeded();
    const phases = await page.locator("#phases-section").boundingBox();
    await page.screenshot({ path: join(outDir, name + "-phases.png"), fullPage: true,
      clip: { x: 0, y: top.y, width: 1300, height: top.height + 12 } });
    await page.locator("#phases-section").screenshot({ path: join(outDir, name + "-phase-view.png") });
    void phases;
  }
} else if (outDir && categories) {
  // The timeline stacked by category (the default for such a trace), hovering the largest
  // band at the peak; then the category section.
  const t = await page.evaluate(() => {
    const tl = window.poolsight.timelines()[0], run = tl.runs[0];
    let i = 0;
    run.used.forEach((u, k) => { if (u > run.used[i]) i = k; });
    return tl.bandCenter(i, 0);
  });
  await page.mouse.move(t.x, t.y);
  await page.screenshot({ path: join(outDir, "html-categories-timeline.png"), clip: { x: 0, y: 0, width: 1200, height: 560 } });
  await page.mouse.move(0, 0);
  await page.locator("#categories-section").screenshot({ path: join(outDir, "html-categories.png") });
  // The flamegraph by bytes: frames read the user's line, the modules, the operator, the category.
  await page.locator("#flame-section").scrollIntoViewIfNeeded();
  await page.click("#metrics button[data-metric=used]");
  await page.fill("#search", "self_attn");
  await page.waitForTimeout(200);
  const box = await page.locator("#flame-section").boundingBox();
  await page.screenshot({ path: join(outDir, "html-torch-flamegraph.png"), clip: { ...box, height: Math.min(box.height, 420) } });
} else if (outDir) {
  // A section's first 420 pixels (a table of many rows runs on).
  const shot = async (name, selector) => {
    await page.locator(selector).scrollIntoViewIfNeeded();
    const box = await page.locator(selector).boundingBox();
    await page.screenshot({ path: join(outDir, name), clip: { ...box, height: Math.min(box.height, 420) } });
  };
  // Hover the largest band of a point a third of the way in, where the tooltip has room.
  const t = await page.evaluate(() => {
    const tl = window.poolsight.timelines()[0], run = tl.runs[0];
    return tl.bandCenter(Math.floor(run.t.length / 3), 0);
  });
  await page.mouse.move(t.x, t.y);
  await page.screenshot({ path: join(outDir, "html-timeline.png"), clip: { x: 0, y: 0, width: 1200, height: 560 } });
  await page.mouse.move(0, 0);
  await shot("html-live.png", "#live-section");
  await page.click("#metrics button[data-metric=used]");
  await page.fill("#search", "Linear");
  await page.waitForTimeout(200);
  await shot("html-flamegraph.png", "#flame-section");
}
await browser.close();
