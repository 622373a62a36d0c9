// The package's browser tests: a JavaScript-only training loop on the shared
// device (the model's forward, backward and SGD in WGSL; only the package is
// Rust) checked against a float64 reference computed here, the reports, the
// partials, f16/bf16, and the typed errors.

import {
  createClipper, combinePartials, partialTotalNorm, internals, clipStateLayoutEntry,
  GradclipError, CLIP_STATE_WGSL, CLIP_STATE_BYTES, REPORT_LOG_LENGTH,
} from "gradclip";
import { test, assert, assertEqual, assertAllClose, assertRejects } from "./harness.js";
import * as mlp from "./mlp.js";

const MAX_NORM = 0.5;
let shared = null;

/** One clipper for the whole suite (creating a device takes a while on SwiftShader). */
async function clipper() {
  shared ??= await createClipper();
  return shared;
}

/** A copy of `size` bytes of `buffer` from `offset`, read back. */
async function readBack(device, buffer, offset, size) {
  const staging = device.createBuffer({ label: "test readback", size, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ });
  const enc = device.createCommandEncoder({ label: "test readback" });
  enc.copyBufferToBuffer(buffer, offset, staging, 0, size);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const bytes = staging.getMappedRange().slice(0);
  staging.destroy();
  return bytes;
}

function storage(device, label, data) {
  const b = device.createBuffer({ label, size: Math.max(4, data.byteLength), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
  device.queue.writeBuffer(b, 0, data);
  return b;
}

function pipeline(device, label, code, entryPoint) {
  const module = device.createShaderModule({ label, code });
  return device.createComputePipeline({ label, layout: "auto", compute: { module, entryPoint } });
}

/** The MLP on the shared device, writing its batch gradient into `grads` (a Gradients). */
function trainer(device, grads, { seed = 1, fused = false } = {}) {
  const { x, t } = mlp.data(seed);
  const params = storage(device, "params", mlp.initialParams(seed + 1));
  const xb = storage(device, "x", x), tb = storage(device, "t", t);
  const perSample = device.createBuffer({ label: "per-sample grads", size: mlp.N * mlp.P * 4, usage: GPUBufferUsage.STORAGE });
  const loss = device.createBuffer({ label: "loss", size: mlp.N * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
  const lr = device.createBuffer({ label: "lr", size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(lr, 0, new Float32Array([0.1, 0, 0, 0]));
  const backward = pipeline(device, "mlp backward", mlp.BACKWARD_WGSL, "backward");
  const reduce = pipeline(device, "mlp reduce", mlp.reduceWgsl(grads.dtype), "reduce");
  const sgd = pipeline(device, "mlp sgd", mlp.sgdWgsl(CLIP_STATE_WGSL, fused), "sgd");
  const bindBackward = device.createBindGroup({ label: "mlp backward", layout: backward.getBindGroupLayout(0), entries: [params, xb, tb, perSample, loss].map((buffer, binding) => ({ binding, resource: { buffer } })) });
  const bindReduce = device.createBindGroup({ label: "mlp reduce", layout: reduce.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: perSample } }, { binding: 1, resource: { buffer: grads.buffer } }] });
  const sgdEntries = [{ binding: 0, resource: { buffer: params } }, { binding: 1, resource: { buffer: grads.buffer } }, { binding: 2, resource: { buffer: lr } }];
  if (fused) sgdEntries.push({ binding: 3, resource: grads.coefficientBinding });
  const bindSgd = device.createBindGroup({ label: "mlp sgd", layout: sgd.getBindGroupLayout(0), entries: sgdEntries });
  const pass = (enc, label, pipe, bind, groups) => {
    const p = enc.beginComputePass({ label });
    p.setPipeline(pipe);
    p.setBindGroup(0, bind);
    p.dispatchWorkgroups(groups);
    p.end();
  };
  return {
    x, t, params,
    /** Submits the backward pass: the gradients land in grads.buffer. */
    backward() {
      const enc = device.createCommandEncoder({ label: "mlp backward" });
      pass(enc, "mlp backward", backward, bindBackward, Math.ceil(mlp.N / 64));
      pass(enc, "mlp reduce", reduce, bindReduce, Math.ceil(mlp.P / (grads.dtype === "f32" ? 64 : 128)));
      device.queue.submit([enc.finish()]);
    },
    /** Submits the SGD step. */
    sgd() {
      const enc = device.createCommandEncoder({ label: "mlp sgd" });
      pass(enc, "mlp sgd", sgd, bindSgd, Math.ceil(mlp.P / 64));
      device.queue.submit([enc.finish()]);
    },
    async readParams() {
      return new Float32Array(await readBack(device, params, 0, mlp.P * 4));
    },
  };
}

async function readF32(device, grads) {
  return new Float32Array(await readBack(device, grads.buffer, 0, grads.byteLength));
}

const relClose = (rel, abs = 0) => (want) => rel * Math.abs(want) + abs;

test("a JS-only training loop: clipped gradients match the float64 reference within 1e-5", async (log) => {
  const { device } = await clipper();
  const grads = await clipper().then((c) => c.createGradients({ named: mlp.TENSORS }));
  const m = trainer(device, grads);
  let clippedSteps = 0;
  for (let step = 1; step <= 8; step++) {
    const params = await m.readParams();
    const want = mlp.reference(params, m.x, m.t);
    const ref = mlp.clipReference(want.grads, MAX_NORM);
    m.backward();
    assertEqual(grads.clipNorm({ maxNorm: MAX_NORM, tensorNorms: true }), step, "clipNorm's step");
    const clipped = await readF32(device, grads);
    const worst = assertAllClose(clipped, ref.clipped, 1e-5, `step ${step}: clipped gradients`);
    const report = await grads.latestReport();
    assertEqual(report.step, step, "report step");
    assertAllClose([report.totalNorm], [ref.norm], relClose(1e-5), "total norm");
    assertAllClose([report.coefficient], [ref.coefficient], relClose(1e-5), "coefficient");
    for (const [name] of mlp.TENSORS) assert(name in report.namedNorms, `namedNorms lacks ${name}`);
    if (ref.coefficient < 1) clippedSteps++;
    log(`step ${step}: loss ${want.loss.toFixed(5)}, norm ${report.totalNorm.toFixed(5)}, coefficient ${report.coefficient.toFixed(5)}, worst error ${worst.toExponential(2)}`);
    m.sgd();
  }
  assert(clippedSteps >= 4, `only ${clippedSteps} of 8 steps needed clipping: the test does not test clipping`);
  const last = mlp.reference(await m.readParams(), m.x, m.t);
  const first = mlp.reference(mlp.initialParams(2), m.x, m.t);
  assert(last.loss < first.loss, `the loss did not fall: ${first.loss} -> ${last.loss}`);
  grads.destroy();
});

test("fused SGD: recordNorm and an optimizer shader multiplying by the coefficient binding", async () => {
  const c = await clipper();
  const { device } = c;
  const grads = await c.createGradients({ sizes: mlp.TENSORS.map(([, n]) => n) });
  const m = trainer(device, grads, { seed: 5, fused: true });
  for (let step = 1; step <= 3; step++) {
    const params = await m.readParams();
    const ref = mlp.clipReference(mlp.reference(params, m.x, m.t).grads, MAX_NORM);
    m.backward();
    grads.recordNorm({ maxNorm: MAX_NORM });
    m.sgd();
    const raw = await readF32(device, grads);
    assertAllClose(raw, ref.clipped.map((v) => v / ref.coefficient), 1e-5, "recordNorm left the gradients as they were");
    const after = await m.readParams();
    const want = Array.from(params, (p, i) => p - 0.1 * ref.clipped[i]);
    assertAllClose(after, want, 1e-5, `step ${step}: parameters after the fused step`);
  }
  grads.destroy();
});

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}
const bf16ToFloat = (h) => new Float32Array(new Uint32Array([h << 16]).buffer)[0];

for (const dtype of ["f16", "bf16"]) {
  test(`${dtype} gradients: the clip matches the float64 reference to the format's rounding`, async (log) => {
    const c = await clipper();
    const grads = await c.createGradients({ named: mlp.TENSORS, dtype });
    assertEqual(grads.dtype, dtype, "dtype");
    const m = trainer(c.device, grads, { seed: 9 });
    const decode = dtype === "f16" ? halfToFloat : bf16ToFloat;
    const read = async () => Array.from(new Uint16Array(await readBack(c.device, grads.buffer, 0, grads.byteLength)).subarray(0, mlp.P), decode);
    m.backward();
    const before = await read();
    // The written 16-bit values are the gradients; the reference starts from them.
    const exact = mlp.reference(await m.readParams(), m.x, m.t).grads;
    const unit = dtype === "f16" ? 2 ** -11 : 2 ** -8;
    assertAllClose(before, exact, relClose(unit, 1e-7), "the JS shader's 16-bit gradients");
    const ref = mlp.clipReference(before, MAX_NORM);
    grads.clipNorm({ maxNorm: MAX_NORM });
    const report = await grads.latestReport();
    assertAllClose([report.totalNorm], [ref.norm], relClose(1e-5), "total norm");
    assert(report.coefficient < 1, "the gradients needed clipping");
    const after = await read();
    // One rounding to the format (half an ulp), plus the f32 coefficient's.
    assertAllClose(after, ref.clipped, relClose(unit * 1.01, 1e-7), "clipped gradients");
    log(`f16Native ${c.f16Native}, norm ${report.totalNorm}, coefficient ${report.coefficient}`);
    grads.destroy();
  });
}

test("unscale: GradScaler's unscale, inf check and scale update fused into the clip", async () => {
  const c = await clipper();
  const grads = await c.createGradients({ sizes: [2] });
  grads.setLossScaler({ initScale: 1024, growthInterval: 1 });
  c.device.queue.writeBuffer(grads.buffer, 0, new Float32Array([3 * 1024, 4 * 1024]));
  grads.clipNorm({ maxNorm: 10, unscale: true });
  const r = await grads.latestReport();
  assertEqual([r.totalNorm, r.unscaledBy, r.lossScale, r.foundInf], [5, 1024, 2048, false], "report");
  assertAllClose(await readF32(c.device, grads), [3, 4], 0, "unscaled gradients");
  c.device.queue.writeBuffer(grads.buffer, 0, new Float32Array([Infinity, 1]));
  grads.clipNorm({ maxNorm: 10, unscale: true });
  const inf = await grads.latestReport();
  assertEqual([inf.foundInf, inf.lossScale], [true, 1024], "an inf backs the scale off");
  grads.destroy();
});

test("value clipping and per-tensor clipping", async () => {
  const c = await clipper();
  const grads = await c.createGradients({ sizes: [3, 2] });
  c.device.queue.writeBuffer(grads.buffer, 0, new Float32Array([0.5, -3, 2, 30, 40]));
  grads.clipValue({ value: 1 });
  assertAllClose(await readF32(c.device, grads), [0.5, -1, 1, 1, 1], 0, "clipValue");
  c.device.queue.writeBuffer(grads.buffer, 0, new Float32Array([0, 0, 2, 30, 40]));
  grads.clipNorm({ maxNorm: 1, perTensor: true, semantics: "tensorflow" });
  assertAllClose(await readF32(c.device, grads), [0, 0, 1, 0.6, 0.8], 1e-7, "per-tensor clip");
  const r = await grads.latestReport();
  assertAllClose(r.tensorNorms, [2, 50], 1e-6, "tensor norms");
  grads.destroy();
});

test("reports: pollReports never waits; reports() collects the rest; dropped counts the lost", async () => {
  const c = await clipper();
  const grads = await c.createGradients({ sizes: [2] });
  c.device.queue.writeBuffer(grads.buffer, 0, new Float32Array([3, 4]));
  const seen = [];
  for (let i = 0; i < 6; i++) {
    grads.recordNorm();
    const polled = grads.pollReports();
    assertEqual(polled.dropped, 0, "dropped while polling");
    seen.push(...polled.reports.map((r) => r.step));
    await new Promise((r) => setTimeout(r, 0)); // let readbacks come back
  }
  const rest = await grads.reports();
  seen.push(...rest.reports.map((r) => r.step));
  assertEqual(seen, [1, 2, 3, 4, 5, 6], "every step reported once, in order");
  assertEqual(rest.reports.at(-1).totalNorm, 5, "norm");
  // More steps than the GPU log holds, unread: the oldest are lost and counted.
  const extra = REPORT_LOG_LENGTH + 6;
  for (let i = 0; i < extra; i++) grads.recordNorm();
  const taken = await grads.reports();
  assertEqual([taken.reports.length, taken.dropped, taken.reports[0].step], [REPORT_LOG_LENGTH, 6, 13], "kept, dropped, oldest kept");
  assertEqual(taken.reports.at(-1).step, 6 + extra, "the newest step");
  grads.destroy();
});

test("partials: two shards clip by their combined norm", async () => {
  const c = await clipper();
  const a = await c.createGradients({ sizes: [2] }), b = await c.createGradients({ sizes: [3] });
  c.device.queue.writeBuffer(a.buffer, 0, new Float32Array([1, 2]));
  c.device.queue.writeBuffer(b.buffer, 0, new Float32Array([2, 4, 4]));
  a.recordNorm();
  b.recordNorm();
  const parts = [(await a.readPartial()).partial, (await b.readPartial()).partial];
  assert(parts.every((p) => p instanceof Uint8Array && p.length === 16), "partials are 16 bytes");
  const all = await combinePartials(parts, 2);
  const norm = await partialTotalNorm(all, 2);
  assertAllClose([norm], [Math.sqrt(41)], 1e-6, "combined norm");
  a.clipWithPartial({ maxNorm: 1 }, all);
  b.clipWithPartial({ maxNorm: 1 }, all);
  const k = 1 / (Math.sqrt(41) + 1e-6);
  assertAllClose(await readF32(c.device, a), [k, 2 * k], 1e-6, "shard a");
  assertAllClose(await readF32(c.device, b), [2 * k, 4 * k, 4 * k], 1e-6, "shard b");
  assertAllClose([(await b.latestReport()).totalNorm], [Math.sqrt(41)], relClose(1e-6), "report");
  a.destroy();
  b.destroy();
});

test("the exported WGSL is the wasm module's, and the layout entry binds it", async () => {
  const w = await internals();
  assertEqual(CLIP_STATE_WGSL, w.clipStateWgsl(), "CLIP_STATE_WGSL");
  assertEqual(CLIP_STATE_BYTES, w.clipStateBytes(), "CLIP_STATE_BYTES");
  assertEqual(REPORT_LOG_LENGTH, w.reportLogLength(), "REPORT_LOG_LENGTH");
  const c = await clipper();
  const grads = await c.createGradients({ sizes: [4] });
  const device = c.device;
  device.pushErrorScope("validation");
  const layout = device.createBindGroupLayout({ entries: [clipStateLayoutEntry(0)] });
  device.createBindGroup({ layout, entries: [{ binding: 0, resource: grads.coefficientBinding }] });
  const e = await device.popErrorScope();
  assert(e === null, `binding the coefficient: ${e?.message}`);
  grads.destroy();
});

test("typed errors on bad input", async () => {
  const c = await clipper();
  const g = await c.createGradients({ named: { a: 3, b: 2 } });
  const cases = [
    [() => g.clipNorm({ maxNorm: -1 }), "INVALID_MAX_NORM"],
    [() => g.clipNorm({ maxNorm: NaN }), "INVALID_MAX_NORM"],
    [() => g.clipNorm({ maxNorm: 0, semantics: "tensorflow" }), "INVALID_MAX_NORM"],
    [() => g.clipNorm({ maxNorm: 1, norm: 0 }), "INVALID_NORM_ORDER"],
    [() => g.clipNorm({ maxNorm: 1, norm: "two" }), "INVALID_OPTIONS"],
    [() => g.clipNorm({ maxNorm: 1, semantics: "jax" }), "INVALID_OPTIONS"],
    [() => g.clipNorm({ max_norm: 1 }), "INVALID_OPTIONS"],
    [() => g.clipNorm(), "INVALID_OPTIONS"],
    [() => g.clipNorm(3), "INVALID_OPTIONS"],
    [() => g.clipValue({ min: 1, max: -1 }), "INVALID_CLAMP_RANGE"],
    [() => g.clipValue({ min: 1 }), "INVALID_OPTIONS"],
    [() => g.setLossScaler({ growthFactor: 0.5 }), "INVALID_LOSS_SCALER"],
    [() => g.tensorBinding("c"), "UNKNOWN_TENSOR"],
    [() => g.tensorBinding(2), "UNKNOWN_TENSOR"],
    [() => g.clipWithPartial({ maxNorm: 1 }, new Uint8Array(8)), "INVALID_OPTIONS"],
    [() => g.clipWithPartial({ maxNorm: 1 }, new Uint8Array(16).fill(0xff)), "INVALID_PARTIAL"],
    [() => combinePartials([new Uint8Array(16).fill(0xff)], 2), "INVALID_PARTIAL"],
    [() => c.createGradients({ sizes: [] }), "EMPTY_LAYOUT"],
    [() => c.createGradients({}), "INVALID_OPTIONS"],
    [() => c.createGradients({ sizes: [4], dtype: "f64" }), "INVALID_OPTIONS"],
    [() => c.createGradients({ sizes: [4], named: { a: 4 } }), "INVALID_OPTIONS"],
    [() => c.createGradients({ named: [["a", 1], ["a", 2]] }), "INVALID_OPTIONS"],
    [() => c.createGradients({ sizes: [4], align: 6 }), "INVALID_OPTIONS"],
    [() => c.createGradients({ sizes: [2 ** 40] }), "TOO_LARGE"],
    [() => createClipper({ limits: "huge" }), "INVALID_OPTIONS"],
    [() => createClipper({ requiredFeatures: ["not-a-feature"] }), "INVALID_OPTIONS"],
  ];
  for (const [fn, code] of cases) await assertRejects(fn, code, GradclipError, `${fn}`);
  // Reports before any clip, then a clip that refuses a non-finite norm.
  await assertRejects(g.latestReport(), "NO_REPORT", GradclipError, "latestReport before a clip");
  c.device.queue.writeBuffer(g.buffer, 0, new Float32Array([1, Infinity, 2, 3, 4]));
  g.clipNorm({ maxNorm: 1, errorIfNonfinite: true });
  await assertRejects(g.latestReport(), "NON_FINITE", GradclipError, "errorIfNonfinite");
  const kept = new Float32Array(await readBack(c.device, g.buffer, 0, 20));
  assertEqual(Array.from(kept), [1, Infinity, 2, 3, 4], "errorIfNonfinite leaves the gradients untouched");
  const { reports } = await g.reports();
  assert(reports.at(-1).nonfinite, "reports() shows nonfinite");
  g.destroy();
  await assertRejects(() => g.clipNorm({ maxNorm: 1 }), "DESTROYED", GradclipError, "after destroy");
  await assertRejects(() => g.pollReports(), "DESTROYED", GradclipError, "pollReports after destroy");
  const e = new GradclipError("INTERNAL", "x");
  assert(e instanceof Error && e.name === "GradclipError", "GradclipError is an Error");
});
