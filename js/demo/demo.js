// The demo page: two copies of a character-level RNN learn Shakespeare's
// sonnets side by side in the browser, from the same start on the same
// batches at the same learning rate; gradclip clips one and only measures the
// other. Written against the JavaScript package alone (import "gradclip").
//
// URL parameters: hidden (H, default 128), batch (B, default 32), seq (T,
// default 32), lr, maxNorm, autostart=1.

import { createClipper, CLIP_STATE_WGSL } from "gradclip";
import * as rnn from "./rnn.js";

const q = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const COLORS = { clipped: "#1f77b4", unclipped: "#e8590c" };
const RUNS = ["clipped", "unclipped"];

/** What the page shows, also read by the browser test (e2e_test.py). */
const state = (window.demoState = {
  ready: false, error: null, adapter: "", running: false, step: 0, generation: 0,
  runs: Object.fromEntries(RUNS.map((r) => [r, { losses: [], norms: [], samples: [] }])),
  drawn: { loss: 0, norm: 0 }, maxLagMs: 0, stepsPerSecond: 0,
});

function fail(e) {
  console.error(e);
  if (state.error) return; // the first error is the one to show
  state.error = `${e?.name ?? "Error"}: ${e?.message ?? e}${e?.code ? ` [${e.code}]` : ""}`;
  $("status").textContent = state.error;
  state.running = false;
}

// The event loop's longest stall while the page runs (the page must stay responsive).
(function watchLag() {
  let last = performance.now();
  setInterval(() => {
    const now = performance.now();
    if (state.running) state.maxLagMs = Math.max(state.maxLagMs, now - last - 100);
    last = now;
  }, 100);
})();

const slider = {
  lr: () => 10 ** parseFloat($("lr").value),
  maxNorm: () => 10 ** parseFloat($("maxnorm").value),
};
function showControls() {
  $("lr-value").textContent = slider.lr().toPrecision(2);
  $("maxnorm-value").textContent = slider.maxNorm().toPrecision(2);
}

async function main() {
  if (q.has("lr")) $("lr").value = Math.log10(parseFloat(q.get("lr")));
  if (q.has("maxNorm")) $("maxnorm").value = Math.log10(parseFloat(q.get("maxNorm")));
  showControls();
  $("lr").oninput = $("maxnorm").oninput = showControls;

  const text = await (await fetch("data/sonnets.txt")).text();
  const alphabet = [...new Set(text)].sort();
  const index = new Map(alphabet.map((c, i) => [c, i]));
  const tokens = Uint32Array.from(text, (c) => index.get(c));
  state.vocabulary = alphabet.length;
  const s = rnn.shapes({ V: alphabet.length, H: +q.get("hidden") || 128, T: +q.get("seq") || 32, B: +q.get("batch") || 32 });
  $("model").textContent = `tanh RNN, ${s.H} hidden units, ${s.P.toLocaleString()} parameters; ${alphabet.length} characters, ${text.length.toLocaleString()} of text; batches of ${s.B} × ${s.T} characters`;

  const clipper = await createClipper();
  const device = clipper.device;
  const info = clipper.adapterInfo;
  state.adapter = `${info.name || "WebGPU adapter"} (${info.backend}${info.driver ? ", " + info.driver : ""})`;
  $("adapter").textContent = state.adapter;
  device.lost.then((l) => fail(new Error(`device lost: ${l.message}`)));
  device.addEventListener("uncapturederror", (e) => fail(e.error));

  const usage = GPUBufferUsage;
  const buffer = (label, size, extra = 0) => device.createBuffer({ label, size, usage: usage.STORAGE | extra });
  const textBuf = buffer("text", tokens.byteLength, usage.COPY_DST);
  device.queue.writeBuffer(textBuf, 0, tokens);
  const stepUniform = device.createBuffer({ label: "step", size: 16, usage: usage.UNIFORM | usage.COPY_DST });
  const sampleUniform = device.createBuffer({ label: "sample step", size: 16, usage: usage.UNIFORM | usage.COPY_DST });
  const compile = (label, code, entry) => device.createComputePipeline({
    label, layout: "auto", compute: { module: device.createShaderModule({ label, code }), entryPoint: entry },
  });
  const n = tokens.length;
  const pipes = {
    train: compile("rnn train", rnn.trainWgsl(s, n), "train"),
    reduce: compile("rnn reduce", rnn.reduceWgsl(s, n), "reduce"),
    sgdClipped: compile("rnn sgd (clipped)", rnn.sgdWgsl(s, n, CLIP_STATE_WGSL, true), "sgd"),
    sgdRaw: compile("rnn sgd", rnn.sgdWgsl(s, n, CLIP_STATE_WGSL, false), "sgd"),
    sample: compile("rnn sample", rnn.sampleWgsl(s, n, index.get("\n")), "sample"),
  };
  const bind = (pipe, label, resources) => device.createBindGroup({
    label, layout: pipe.getBindGroupLayout(0),
    entries: resources.map((r, binding) => ({ binding, resource: r.buffer ? r : { buffer: r } })),
  });
  const init = rnn.initialParams(s, 20261123);

  /** One run: its parameters, its gradclip gradients and its bind groups. */
  async function makeRun(name) {
    const clipped = name === "clipped";
    const grads = await clipper.createGradients({ named: s.tensors, label: `${name} gradients` });
    const params = buffer(`${name} params`, s.P * 4, usage.COPY_DST);
    const perSeq = buffer(`${name} per-sequence gradients`, s.B * s.P * 4);
    const hs = buffer(`${name} hidden states`, s.B * (s.T + 1) * s.H * 4);
    const dys = buffer(`${name} output gradients`, s.B * s.T * s.V * 4);
    const losses = buffer(`${name} losses`, s.B * 4);
    const history = buffer(`${name} loss history`, rnn.HISTORY * 4, usage.COPY_SRC);
    const sampleOut = buffer(`${name} sample`, rnn.SAMPLE_CHARS * 4, usage.COPY_SRC);
    const sgd = clipped ? pipes.sgdClipped : pipes.sgdRaw;
    const sgdResources = [params, grads.buffer, stepUniform];
    if (clipped) sgdResources.push(grads.coefficientBinding);
    return {
      name, clipped, grads, params, history, sampleOut,
      historyRead: device.createBuffer({ label: `${name} loss readback`, size: rnn.HISTORY * 4, usage: usage.MAP_READ | usage.COPY_DST }),
      sampleRead: device.createBuffer({ label: `${name} sample readback`, size: rnn.SAMPLE_CHARS * 4, usage: usage.MAP_READ | usage.COPY_DST }),
      historyBusy: false, sampleBusy: false, historyUpTo: 0, reportOffset: 0,
      norms: new Map(), losses: new Map(),
      groups: {
        train: bind(pipes.train, `${name} train`, [params, textBuf, stepUniform, perSeq, hs, dys, losses]),
        reduce: bind(pipes.reduce, `${name} reduce`, [perSeq, losses, stepUniform, grads.buffer, history]),
        sgd: bind(sgd, `${name} sgd`, sgdResources),
        sample: bind(pipes.sample, `${name} sample`, [params, sampleUniform, sampleOut]),
      },
      sgd,
    };
  }
  const runs = [];
  for (const name of RUNS) runs.push(await makeRun(name));

  const pass = (enc, pipe, group, groups) => {
    const p = enc.beginComputePass();
    p.setPipeline(pipe);
    p.setBindGroup(0, group);
    p.dispatchWorkgroups(groups);
    p.end();
  };
  const stepData = new ArrayBuffer(16);
  const stepU32 = new Uint32Array(stepData), stepF32 = new Float32Array(stepData);

  function reset() {
    state.generation++;
    state.step = 0;
    for (const run of runs) {
      device.queue.writeBuffer(run.params, 0, init);
      run.norms.clear();
      run.losses.clear();
      run.historyUpTo = 0;
      run.reportOffset = Infinity; // until the first step of the new run
      Object.assign(state.runs[run.name], { losses: [], norms: [], samples: [] });
      $(`${run.name}-text`).textContent = "";
      $(`${run.name}-status`).textContent = "";
    }
    draw();
  }

  /** Submits one training step of both runs: forward/backward, gradient sum, gradclip, SGD. */
  function trainStep() {
    const step = ++state.step;
    stepU32[0] = step;
    stepU32[1] = Math.imul(step, 0x9e3779b9) >>> 0; // the batch: the same sequence of batches after every Reset
    stepF32[2] = slider.lr();
    stepF32[3] = 1;
    device.queue.writeBuffer(stepUniform, 0, stepData);
    for (const run of runs) {
      const enc = device.createCommandEncoder({ label: `${run.name} step` });
      pass(enc, pipes.train, run.groups.train, s.B);
      pass(enc, pipes.reduce, run.groups.reduce, Math.ceil(s.P / 64));
      device.queue.submit([enc.finish()]);
      // The clipped run's SGD multiplies by the factor this leaves in the
      // clip state; the other run only gets its norm measured.
      const reportStep = run.clipped ? run.grads.recordNorm({ maxNorm: slider.maxNorm() }) : run.grads.recordNorm();
      // gradclip numbers the reports of these gradients since their
      // creation; the page counts from the last Reset.
      if (step === 1) run.reportOffset = reportStep - 1;
      const sgd = device.createCommandEncoder({ label: `${run.name} sgd` });
      pass(sgd, run.sgd, run.groups.sgd, Math.ceil(s.P / 64));
      device.queue.submit([sgd.finish()]);
    }
  }

  /** Starts the readbacks of the losses (and, now and then, a sample); none waits. */
  function startReadbacks(withSample) {
    const generation = state.generation, upTo = state.step;
    for (const run of runs) {
      if (!run.historyBusy && upTo > run.historyUpTo) {
        run.historyBusy = true;
        const enc = device.createCommandEncoder({ label: `${run.name} loss readback` });
        enc.copyBufferToBuffer(run.history, 0, run.historyRead, 0, rnn.HISTORY * 4);
        device.queue.submit([enc.finish()]);
        run.historyRead.mapAsync(GPUMapMode.READ).then(() => {
          const h = new Float32Array(run.historyRead.getMappedRange());
          if (generation === state.generation) {
            for (let st = Math.max(run.historyUpTo + 1, upTo - rnn.HISTORY + 1); st <= upTo; st++) run.losses.set(st, h[st % rnn.HISTORY]);
            run.historyUpTo = upTo;
          }
          run.historyRead.unmap();
          run.historyBusy = false;
        }, fail);
      }
      if (withSample && !run.sampleBusy) {
        run.sampleBusy = true;
        const u = new ArrayBuffer(16);
        new Uint32Array(u, 0, 2).set([upTo, (Math.random() * 2 ** 32) >>> 0]);
        new Float32Array(u, 8, 2).set([0, 0.8]);
        device.queue.writeBuffer(sampleUniform, 0, u);
        const enc = device.createCommandEncoder({ label: `${run.name} sample` });
        pass(enc, pipes.sample, run.groups.sample, 1);
        enc.copyBufferToBuffer(run.sampleOut, 0, run.sampleRead, 0, rnn.SAMPLE_CHARS * 4);
        device.queue.submit([enc.finish()]);
        run.sampleRead.mapAsync(GPUMapMode.READ).then(() => {
          const chars = new Uint32Array(run.sampleRead.getMappedRange());
          const sample = Array.from(chars, (c) => alphabet[c] ?? "?").join("");
          run.sampleRead.unmap();
          run.sampleBusy = false;
          if (generation !== state.generation) return;
          state.runs[run.name].samples.push({ step: upTo, text: sample });
          $(`${run.name}-text`).textContent = sample;
          $(`${run.name}-sample-step`).textContent = `after step ${upTo}`;
        }, fail);
      }
    }
  }

  /** Moves what came back (reports, losses) into the page's series, in step order. */
  function collect() {
    for (const run of runs) {
      for (const r of run.grads.pollReports().reports) {
        const step = r.step - run.reportOffset;
        if (step >= 1) run.norms.set(step, r.totalNorm);
      }
      const series = state.runs[run.name];
      let next = series.losses.length + 1;
      while (run.losses.has(next) && run.norms.has(next)) {
        series.losses.push(run.losses.get(next));
        series.norms.push(run.norms.get(next));
        run.losses.delete(next);
        run.norms.delete(next);
        next++;
      }
      const last = series.losses.at(-1);
      const blownUp = 1.5 * Math.log(alphabet.length); // well above a uniform guess's loss
      $(`${run.name}-status`).textContent = last === undefined ? "" : !Number.isFinite(last) || last > blownUp
        ? "diverged: the loss is " + (Number.isFinite(last) ? last.toFixed(1) : String(last))
        : `loss ${last.toFixed(3)}, gradient norm ${series.norms.at(-1).toPrecision(3)}`;
    }
  }

  let lastSample = 0;
  async function loop() {
    let stepsPerTick = 1;
    const t0 = performance.now(), s0 = state.step;
    while (state.running) {
      const tick = performance.now();
      for (let i = 0; i < stepsPerTick; i++) trainStep();
      const withSample = performance.now() - lastSample > 1500;
      if (withSample) lastSample = performance.now();
      startReadbacks(withSample);
      // One tick in flight at most, so the GPU's queue never runs away from the page.
      await device.queue.onSubmittedWorkDone();
      collect();
      draw();
      const ms = performance.now() - tick;
      stepsPerTick = Math.max(1, Math.min(32, Math.round(stepsPerTick * (ms < 60 ? 1.5 : ms > 150 ? 0.6 : 1))));
      state.stepsPerSecond = (state.step - s0) / ((performance.now() - t0) / 1000);
      $("speed").textContent = `step ${state.step}, ${state.stepsPerSecond.toFixed(1)} steps/s`;
      await new Promise((r) => setTimeout(r, 0));
    }
    // Let the last readbacks land.
    await device.queue.onSubmittedWorkDone();
    startReadbacks(true);
    await device.queue.onSubmittedWorkDone();
    await new Promise((r) => setTimeout(r, 50));
    collect();
    draw();
  }

  $("start").onclick = () => {
    state.running = !state.running;
    $("start").textContent = state.running ? "Pause" : "Start";
    if (state.running) loop().catch(fail);
  };
  $("reset").onclick = () => { if (!state.running) reset(); };
  reset();
  state.ready = true;
  $("status").textContent = "";
  if (q.get("autostart") === "1") $("start").click();
}

/** Draws one chart: a line per run, log-scaled if asked, the max norm as a dashed line. */
function chart(canvas, key, { log = false, line = null, cap = Infinity } = {}) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 36;
  ctx.clearRect(0, 0, w, h);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  const values = RUNS.flatMap((r) => state.runs[r][key]).filter((v) => Number.isFinite(v) && (!log || v > 0));
  const n = Math.max(2, ...RUNS.map((r) => state.runs[r][key].length));
  const f = log ? Math.log10 : (v) => v;
  let lo = values.length ? Math.min(...values.map(f)) : 0, hi = values.length ? Math.max(...values.map(f)) : 1;
  if (line !== null) { lo = Math.min(lo, f(line)); hi = Math.max(hi, f(line)); }
  if (!log) lo = Math.min(lo, 0);
  hi = Math.min(hi, f(cap));
  if (hi - lo < 1e-6) hi = lo + 1;
  const x = (i) => pad + (i / (n - 1)) * (w - pad - 8);
  const y = (v) => h - 18 - ((f(v) - lo) / (hi - lo)) * (h - 30);
  ctx.strokeStyle = "#ccc";
  ctx.fillStyle = "#555";
  ctx.font = "11px sans-serif";
  ctx.beginPath();
  ctx.moveTo(pad, 8); ctx.lineTo(pad, h - 18); ctx.lineTo(w - 8, h - 18);
  ctx.stroke();
  ctx.fillText(log ? `1e${hi.toFixed(1)}` : hi.toPrecision(3), 2, 14);
  ctx.fillText(log ? `1e${lo.toFixed(1)}` : lo.toPrecision(3), 2, h - 20);
  ctx.fillText(`step ${n}`, w - 60, h - 4);
  if (line !== null) {
    ctx.setLineDash([4, 4]);
    ctx.strokeStyle = "#888";
    ctx.beginPath(); ctx.moveTo(pad, y(line)); ctx.lineTo(w - 8, y(line)); ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillText("max norm", w - 60, y(line) - 3);
  }
  let segments = 0;
  for (const r of RUNS) {
    const series = state.runs[r][key];
    ctx.strokeStyle = COLORS[r];
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    for (let i = 0; i < series.length; i++) {
      const v = series[i];
      if (!Number.isFinite(v) || (log && v <= 0)) {
        // Blown up: a cross at the top of the chart.
        if (pen) { ctx.stroke(); ctx.beginPath(); pen = false; }
        ctx.fillStyle = COLORS[r];
        ctx.fillText("×", x(i) - 3, 18);
        continue;
      }
      const yy = Math.max(8, y(Math.min(v, cap)));
      if (pen) { ctx.lineTo(x(i), yy); segments++; } else ctx.moveTo(x(i), yy);
      pen = true;
    }
    ctx.stroke();
  }
  return segments;
}

function draw() {
  // Above 1.5 times the loss of a uniform guess, a run has blown up: the
  // chart stops there, so that the learning run stays readable.
  state.drawn.loss = chart($("loss-chart"), "losses", { cap: 1.5 * Math.log(state.vocabulary || 64) });
  state.drawn.norm = chart($("norm-chart"), "norms", { log: true, line: slider.maxNorm() });
}

main().catch(fail);
