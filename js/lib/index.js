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

/** WGSL declaration of the record behind Gradients.coefficientBinding. */
export const CLIP_STATE_WGSL = `\
// gradclip's clip state (48 bytes at offset 0 of the coefficient binding).
// Multiply the gradients by \`coefficient\` on load; skip the step when
// \`nonfinite != 0u\` with errorIfNonfinite, or when \`found_inf != 0u\` after an
// unscaling clip (\`coefficient\` is 1 then). \`loss_scale\` is the scale for the
// next backward pass.
struct ClipState {
    total_norm: f32,
    coefficient: f32,
    nonfinite: u32,
    scale_kind: u32,
    dispatch: array<u32, 3>,
    found_inf: u32,
    loss_scale: f32,
    unscaled_by: f32,
    growth_tracker: u32,
    _pad: u32,
}
`;

/** Byte size of the ClipState record. */
export const CLIP_STATE_BYTES = 48;

/**
 * The bind-group-layout entry of the coefficient binding: a read-only
 * storage buffer of at least CLIP_STATE_BYTES.
 */
export function clipStateLayoutEntry(binding, visibility = GPUShaderStage.COMPUTE) {
  return { binding, visibility, buffer: { type: "read-only-storage", minBindingSize: CLIP_STATE_BYTES } };
}
