// gradclip for JavaScript trainers on WebGPU: the ES-module entry point.
//
// The package creates the WebGPU device and the gradient buffers (wgpu
// cannot adopt a GPUBuffer made by JavaScript), hands JavaScript the
// GPUDevice and GPUBuffers to run its own shaders on, and clips the
// gradients with gradclip's WGSL passes on the same queue. Declarations and
// docs: index.d.ts; the sharing contract: ../README.md.
import init, * as wasm from "../wasm/gradclip_js.js";

/** An error of this package: `code` says which (see ErrorCode in index.d.ts). */
export class GradclipError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "GradclipError";
    this.code = code;
  }
}

let loading = null;

/**
 * Loads and instantiates the wasm module (once; later calls share the first
 * load). createClipper() calls it; call it yourself to load early.
 */
export function load() {
  loading ??= init()
    .then(() => wasm.setErrorClass(GradclipError))
    .catch((e) => {
      loading = null;
      throw new GradclipError("LOAD_FAILED", `loading gradclip's wasm module failed: ${e?.message ?? e}`);
    });
  return loading;
}

/** Requests a WebGPU device and makes gradclip's pipelines on it. */
export async function createClipper(options) {
  if (typeof navigator === "undefined" || !navigator.gpu) {
    throw new GradclipError("NO_WEBGPU", "createClipper: this environment has no WebGPU (navigator.gpu is missing)");
  }
  await load();
  return wasm.createClipper(options);
}

/**
 * gradclip's WGSL for your own shaders: `struct ClipState` (the record behind
 * Gradients.coefficientBinding) and `clip_apply(g, clip)`, which multiplies a
 * gradient exactly as gradclip's scale pass does. build.sh writes it from the
 * core's shaders/clip_state.wgsl; a browser test checks it is the text the
 * wasm module was built with.
 */
export { CLIP_STATE_WGSL } from "../wasm/clip_state.js";

/** Byte size of the ClipState record. */
export const CLIP_STATE_BYTES = 64;

/** Reports the GPU keeps between reads: read at least this often to lose none. */
export const REPORT_LOG_LENGTH = 64;

/**
 * The partial of every shard together: `partials` are the 16-byte
 * `partial`s of `readPartial()` (or of reports), all of one norm order.
 */
export async function combinePartials(partials, norm) {
  await load();
  return wasm.combinePartials(partials, norm);
}

/** The norm a partial stands for, computed in float64. */
export async function partialTotalNorm(partial, norm) {
  await load();
  return wasm.partialTotalNorm(partial, norm);
}

/** The wasm module's own exports, for the package's tests. @internal */
export async function internals() {
  await load();
  return wasm;
}

/**
 * The bind-group-layout entry of the coefficient binding: a read-only
 * storage buffer of at least CLIP_STATE_BYTES.
 */
export function clipStateLayoutEntry(binding, visibility = GPUShaderStage.COMPUTE) {
  return { binding, visibility, buffer: { type: "read-only-storage", minBindingSize: CLIP_STATE_BYTES } };
}
