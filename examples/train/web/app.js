// The demo page: UI, the training loop and the charts. The model, its
// gradients, gradclip's clip (fixed, ZClip or AutoClip) and the SGD step all
// run on the GPU in the wasm module; each `demo.step()` resolves when that
// step's report is mapped, so the page's event loop (clicks, drawing) runs
// between steps.
import init, { start_demo } from "./pkg/train_web.js";

const $ = (id) => document.getElementById(id);
// What the browser test reads: progress, the series of each run (Reset
// starts a new one; earlier runs stay on the charts, faded), and how much
// was drawn. Thresholds and boundaries are Infinity where nothing could be
// clipped (WebDriver hands them over as null).
const state = (window.demoState = {
  ready: false, running: false, error: null, adapter: "",
  runs: [],                                       // one entry per step in each series
  current: null,                                  // the latest run
  drawn: { loss: 0, norm: 0, threshold: 0, clipped: 0 }, // of the latest run, in the charts
  maxLagMs: 0,                                    // longest event-loop stall while training
  zclipWarmup: 0,                                 // ZClip's first steps, which have no threshold
});
function newRun() {
  state.current = { steps: [], losses: [], norms: [], modes: [], coefficients: [],
                    thresholds: [], boundaries: [] };
  state.runs.push(state.current);
  if (state.runs.length > 4) state.runs.shift();
}
newRun();

// A line's colour is the clipping mode of its step.
const COLORS = { none: "#d62728", fixed: "#1f77b4", zclip: "#2ca02c", autoclip: "#9467bd" };
const THRESHOLD_COLOR = "#222";

function mode() { return $("mode").value; }
function maxNorm() { return Math.pow(10, parseFloat($("maxnorm").value)); }
function showMaxNorm() { $("maxnorm-value").textContent = maxNorm().toPrecision(2); }
function fmt(x) { return Number.isFinite(x) ? (Math.abs(x) >= 1e4 ? x.toExponential(2) : x.toFixed(4)) : String(x); }
const usable = (v) => Number.isFinite(v) && v > 0;

// A line chart with a log y axis of one series of every run, earlier runs
// faded; non-finite values (a diverged run) end the line. With `threshold`,
// the latest run's threshold (the smallest norm it would have clipped) is
// drawn as a dark line, with gaps where there was none (no clipping, ZClip's
// warm-up), its clipped steps are marked, and `extraLine` (the fixed max
// norm being set) is dashed. Returns what was drawn for the latest run.
function drawChart(canvas, title, key, threshold, extraLine) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 60, right = 12, top = 24, bottom = 26;
  const drawn = { line: 0, threshold: 0, clipped: 0 };
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
  ctx.fillStyle = "#222"; ctx.font = "13px system-ui, sans-serif";
  ctx.fillText(title, left, 16);
  const cur = state.current;
  const n = Math.max(...state.runs.map((r) => r[key].length));
  const finite = state.runs.flatMap((r) => r[key]).filter(usable);
  const bounds = threshold ? cur.boundaries.filter(usable) : [];
  if (finite.length === 0) return drawn;
  const all = finite.concat(bounds, extraLine ? [extraLine] : []);
  let lo = Math.log10(all.reduce((a, b) => Math.min(a, b)));
  let hi = Math.log10(all.reduce((a, b) => Math.max(a, b)));
  lo = Math.floor(lo * 2) / 2 - 0.1; hi = Math.ceil(hi * 2) / 2 + 0.1;
  const x = (i) => left + (w - left - right) * (n <= 1 ? 0 : i / (n - 1));
  const y = (v) => top + (h - top - bottom) * (1 - (Math.log10(v) - lo) / (hi - lo));
  // grid and labels
  ctx.strokeStyle = "#e5e8ee"; ctx.fillStyle = "#555"; ctx.lineWidth = 1;
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e++) {
    ctx.beginPath(); ctx.moveTo(left, y(10 ** e)); ctx.lineTo(w - right, y(10 ** e)); ctx.stroke();
    ctx.fillText("1e" + e, 8, y(10 ** e) + 4);
  }
  ctx.fillText("step " + n, w - right - 80, h - 8);
  if (extraLine) {
    ctx.strokeStyle = "#888"; ctx.setLineDash([4, 4]);
    ctx.beginPath(); ctx.moveTo(left, y(extraLine)); ctx.lineTo(w - right, y(extraLine)); ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.lineWidth = 2;
  for (const run of state.runs) {
    const values = run[key], latest = run === cur;
    ctx.globalAlpha = latest ? 1 : 0.3;
    for (let i = 1; i < values.length; i++) {
      const a = values[i - 1], b = values[i];
      if (!(usable(a) && usable(b))) break;
      ctx.strokeStyle = COLORS[run.modes[i]];
      ctx.beginPath(); ctx.moveTo(x(i - 1), y(a)); ctx.lineTo(x(i), y(b)); ctx.stroke();
      if (latest) drawn.line++;
    }
  }
  ctx.globalAlpha = 1;
  if (threshold) {
    ctx.strokeStyle = THRESHOLD_COLOR; ctx.lineWidth = 1.5;
    const t = cur.boundaries;
    for (let i = 1; i < t.length; i++) {
      if (!(usable(t[i - 1]) && usable(t[i]))) continue;
      ctx.beginPath(); ctx.moveTo(x(i - 1), y(t[i - 1])); ctx.lineTo(x(i), y(t[i])); ctx.stroke();
      drawn.threshold++;
    }
    // A clipped step: a ring on its norm.
    ctx.lineWidth = 1.5;
    for (let i = 0; i < cur.norms.length; i++) {
      if (!(cur.coefficients[i] < 1 && usable(cur.norms[i]))) continue;
      ctx.strokeStyle = THRESHOLD_COLOR;
      ctx.beginPath(); ctx.arc(x(i), y(cur.norms[i]), 3.5, 0, 2 * Math.PI); ctx.stroke();
      drawn.clipped++;
    }
  }
  return drawn;
}

let drawPending = false;
function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    state.drawn.loss = drawChart($("loss-chart"), "loss (MSE, log scale)", "losses").line;
    const norm = drawChart($("norm-chart"),
      "gradient norm before clipping, and the threshold of the latest run (log scale)",
      "norms", true, mode() === "fixed" ? maxNorm() : null);
    state.drawn.norm = norm.line; state.drawn.threshold = norm.threshold; state.drawn.clipped = norm.clipped;
  });
}

// Event-loop lag: a 50 ms timer that notes how late it fires while training.
let lastTick = performance.now();
setInterval(() => {
  const now = performance.now();
  if (state.running) state.maxLagMs = Math.max(state.maxLagMs, now - lastTick - 50);
  lastTick = now;
}, 50);

async function trainLoop(demo) {
  let clippedSteps = parseInt($("clipped").textContent, 10);
  let t0 = performance.now(), done = 0;
  while (state.running) {
    const m = mode();
    const r = await demo.step(m, maxNorm());
    const run = state.current;
    run.steps.push(r.step); run.losses.push(r.loss); run.norms.push(r.grad_norm); run.modes.push(m);
    run.coefficients.push(r.coefficient); run.thresholds.push(r.threshold); run.boundaries.push(r.boundary);
    if (r.coefficient < 1) clippedSteps++;
    $("step").textContent = r.step; $("loss").textContent = fmt(r.loss);
    $("norm").textContent = fmt(r.grad_norm); $("threshold").textContent = fmt(r.boundary);
    $("clipped").textContent = clippedSteps;
    done++;
    const now = performance.now();
    if (now - t0 > 1000) {
      $("rate").textContent = (done * 1000 / (now - t0)).toFixed(1);
      t0 = now; done = 0;
    }
    r.free();
    scheduleDraw();
  }
}

function showMode() {
  $("maxnorm").disabled = mode() !== "fixed";
  scheduleDraw();
}

async function main() {
  showMaxNorm();
  $("maxnorm").addEventListener("input", () => { showMaxNorm(); scheduleDraw(); });
  $("mode").addEventListener("change", showMode);
  showMode();
  for (const [m, c] of Object.entries(COLORS)) $("swatch-" + m).style.background = c;
  if (!navigator.gpu) throw new Error("This browser has no WebGPU (navigator.gpu is missing).");
  await init();
  const demo = await start_demo();
  // The browser's own words for the adapter, with wgpu's device type and back end.
  const info = (await navigator.gpu.requestAdapter())?.info;
  const described = info ? [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") : "";
  state.adapter = described ? `${described} (${demo.adapter()})` : demo.adapter();
  $("adapter").textContent = state.adapter;
  $("model").textContent = demo.model();
  $("adaptive").textContent = demo.adaptive();
  state.zclipWarmup = demo.zclip_warmup();
  $("lr").value = Number(demo.lr().toPrecision(4));
  $("lr").addEventListener("change", () => {
    const lr = parseFloat($("lr").value);
    if (lr > 0) demo.set_lr(lr);
  });
  let loop = Promise.resolve();
  $("start").addEventListener("click", () => {
    state.running = !state.running;
    $("start").textContent = state.running ? "Stop" : "Start";
    if (state.running) loop = trainLoop(demo).catch(fail);
  });
  // Reset stops training first, so that no step in flight lands in the new run.
  $("reset").addEventListener("click", async () => {
    state.running = false;
    $("start").textContent = "Start";
    await loop;
    demo.reset();
    newRun();
    $("clipped").textContent = "0"; $("step").textContent = "0";
    scheduleDraw();
  });
  $("start").disabled = $("reset").disabled = false;
  state.ready = true;
}

function fail(e) {
  state.error = String(e && e.message ? e.message : e);
  state.running = false;
  $("error").textContent = "Error: " + state.error;
  $("start").textContent = "Start";
}

main().catch(fail);
