/// <reference types="@webgpu/types" />
/**
 * gradclip for JavaScript trainers on WebGPU: global-norm gradient clipping
 * (PyTorch `clip_grad_norm_` / TensorFlow `clip_by_global_norm` semantics,
 * overflow-safe norms, per-tensor norms, f16/bf16 with GradScaler-style loss
 * scaling) on the GPU, on a device shared with your own shaders.
 *
 * ## The sharing contract
 *
 * - **The package creates the device** ({@link createClipper}) and hands you
 *   its `GPUDevice` ({@link Clipper.device}): create your buffers, pipelines
 *   and command encoders on it, and submit on `device.queue`.
 * - **The package creates the gradient buffer** ({@link Clipper.createGradients})
 *   and owns it: your shaders write the gradients into
 *   {@link Gradients.buffer} at {@link TensorInfo.byteOffset}. Do not
 *   `destroy()` it; call {@link Gradients.destroy} instead. (wgpu cannot
 *   adopt a `GPUBuffer` made in JavaScript, so there is no way to hand your
 *   own buffer to the package.)
 * - **Order is submission order.** Every clip method records a command
 *   buffer of its own and submits it on the device's only queue when you
 *   call it. So: submit the backward pass that writes the gradients, then
 *   call {@link Gradients.clipNorm}, then submit the optimizer step that reads
 *   them (or {@link Gradients.coefficientBinding}). A backward pass still
 *   sitting in an unsubmitted encoder when you call `clipNorm` is not seen.
 * - **Nothing blocks.** Every clip's report goes into a log of the last
 *   {@link REPORT_LOG_LENGTH} steps on the GPU; nothing is copied back per
 *   step. {@link Gradients.pollReports} returns the reports whose readback
 *   is back and starts the next one (call it once per step: it never waits);
 *   {@link Gradients.reports} and {@link Gradients.latestReport} resolve once
 *   a copy submitted at call time is back, while you go on submitting steps.
 * - **Errors.** Misuse throws (or rejects with) a {@link GradclipError} with a
 *   `code`, before anything is recorded. WebGPU errors in the package's own
 *   submissions are caught in error scopes and reported as `GPU_VALIDATION`
 *   by the next call on the same {@link Gradients}; errors in your own work
 *   go to your error scopes or `device.onuncapturederror`, as usual.
 *
 * @packageDocumentation
 */

/** Element type of a gradient buffer. */
export type Dtype = "f32" | "f16" | "bf16";

/** The `code` of a {@link GradclipError}. */
export type ErrorCode =
  /** No `navigator.gpu`, no adapter, or `requestDevice` failed. */
  | "NO_WEBGPU"
  /** The wasm module could not be fetched or instantiated. */
  | "LOAD_FAILED"
  /** An option is unknown, missing, of the wrong type or out of its set of values. */
  | "INVALID_OPTIONS"
  /** `requiredFeatures` names a feature the adapter does not offer. */
  | "UNSUPPORTED_FEATURE"
  /** `maxNorm` is NaN, infinite or negative (or 0 with TensorFlow semantics). */
  | "INVALID_MAX_NORM"
  /** `norm` is not a positive number. */
  | "INVALID_NORM_ORDER"
  /** `clipValue` bounds are NaN or `min > max`. */
  | "INVALID_CLAMP_RANGE"
  /** `setLossScaler` parameters outside GradScaler's domain. */
  | "INVALID_LOSS_SCALER"
  /** A layout without any tensor. */
  | "EMPTY_LAYOUT"
  /** The layout's size does not fit in 2^53 bytes. */
  | "LAYOUT_OVERFLOW"
  /** The layout needs a larger buffer or binding than the device allows. */
  | "TOO_LARGE"
  /** The device lacks a limit gradclip needs. */
  | "UNSUPPORTED_DEVICE"
  /** The operation does not support this mode. */
  | "UNSUPPORTED"
  /** `tensorBinding` was given an index or name the layout does not have. */
  | "UNKNOWN_TENSOR"
  /** A partial's 16 bytes are no reduction's (`clipWithPartial`, `combinePartials`, `partialTotalNorm`). */
  | "INVALID_PARTIAL"
  /** The device was lost or destroyed. */
  | "DEVICE_LOST"
  /** `latestReport` of a clip made with `errorIfNonfinite` whose norm was NaN or infinite: the gradients were left untouched. */
  | "NON_FINITE"
  /** `latestReport` before any norm clip was recorded. */
  | "NO_REPORT"
  /** `latestReport` while no recorded clip was submitted yet. */
  | "NOT_SUBMITTED"
  /** Mapping a report back failed (device lost, say). */
  | "READBACK"
  /** WebGPU rejected an object the package created. */
  | "GPU_ERROR"
  /** WebGPU ran out of memory creating an object of the package. */
  | "OUT_OF_MEMORY"
  /** WebGPU rejected one of the package's submissions (a destroyed gradient buffer, say); reported by the next call. */
  | "GPU_VALIDATION"
  /** The object (or its Clipper) was destroyed. */
  | "DESTROYED"
  /** A bug in the package; please report it. */
  | "INTERNAL";

/** Every error this package throws or rejects with. */
export class GradclipError extends Error {
  constructor(code: ErrorCode, message: string);
  readonly name: "GradclipError";
  /** Which error: stable across versions, unlike the message. */
  readonly code: ErrorCode;
}

/** Options of {@link createClipper}. */
export interface CreateClipperOptions {
  /** Passed to `navigator.gpu.requestAdapter`. */
  powerPreference?: GPUPowerPreference;
  /**
   * `"adapter"` (default): every limit the adapter offers, so that large
   * gradient buffers bind in few windows. `"default"`: WebGPU's default
   * limits, what every device has.
   */
  limits?: "adapter" | "default";
  /**
   * WebGPU features to require. Default: `["shader-f16"]` where the adapter
   * offers it (f16 gradients are then read natively, and your shaders may
   * `enable f16;`), else none. Giving the list replaces the default.
   */
  requiredFeatures?: GPUFeatureName[];
}

/**
 * Loads the wasm module (once) if needed, requests a WebGPU adapter and
 * device, and makes gradclip's pipelines on it.
 *
 * @throws {GradclipError} `NO_WEBGPU`, `LOAD_FAILED`, `INVALID_OPTIONS`,
 *   `UNSUPPORTED_FEATURE`, `UNSUPPORTED_DEVICE`, `GPU_ERROR`.
 */
export function createClipper(options?: CreateClipperOptions): Promise<Clipper>;

/** Loads and instantiates the wasm module (createClipper does it for you). */
export function load(): Promise<void>;

/** The device and gradclip's pipelines on it. */
export interface Clipper {
  /** The `GPUDevice` to create your own buffers and pipelines on and submit to. */
  readonly device: GPUDevice;
  /** The adapter as wgpu describes it (browsers may leave `name` empty). */
  readonly adapterInfo: {
    name: string;
    deviceType: string;
    driver: string;
    driverInfo: string;
    backend: string;
  };
  /** Whether f16 gradients are read as WGSL `f16` (the device has `shader-f16`). */
  readonly f16Native: boolean;
  /**
   * Creates the gradient buffer of a layout (usage
   * `STORAGE | COPY_SRC | COPY_DST`, zero-filled) and binds it for every
   * later clip: allocates everything clipping needs, once.
   *
   * @throws {GradclipError} `INVALID_OPTIONS`, `EMPTY_LAYOUT`,
   *   `LAYOUT_OVERFLOW`, `TOO_LARGE`, `GPU_ERROR`, `OUT_OF_MEMORY`, `DESTROYED`.
   */
  createGradients(options: GradientsOptions): Promise<Gradients>;
  /**
   * Destroys the device (`GPUDevice.destroy()`): every buffer on it, yours
   * included, and every {@link Gradients} of this clipper.
   */
  destroy(): void;
}

/** Options of {@link Clipper.createGradients}: `sizes` or `named`. */
export interface GradientsOptions {
  /** Element counts of the tensors, in order (zero allowed). */
  sizes?: number[];
  /**
   * Named tensors, `{ "fc1.weight": 784 * 128, "fc1.bias": 128 }` (in
   * insertion order) or `[["fc1.weight", 100352], ...]`. Reports then carry
   * `namedNorms`, and {@link Gradients.tensorBinding} takes names.
   */
  named?: Record<string, number> | Array<[string, number]>;
  /** Element type (default `"f32"`). */
  dtype?: Dtype;
  /**
   * Each tensor starts at a multiple of this many bytes: a power of two, at
   * least 4 (default 4: packed — back to back for f32, at even elements for
   * 16-bit types). Use `device.limits.minStorageBufferOffsetAlignment` (256)
   * to bind every tensor on its own with {@link Gradients.tensorBinding}.
   */
  align?: number;
  /** Label of the `GPUBuffer`. */
  label?: string;
}

/** Where one tensor lives in {@link Gradients.buffer}. */
export interface TensorInfo {
  /** Present when the layout was made with `named`. */
  name?: string;
  elements: number;
  /** First element, counted in elements of the buffer's dtype. */
  offset: number;
  byteOffset: number;
  /** `elements` times the element size. */
  byteLength: number;
}

/** Options of {@link Gradients.clipNorm} and {@link Gradients.recordNorm}. */
export interface ClipNormOptions {
  /**
   * The norm to clip to (`clip_grad_norm_`'s `max_norm`): finite, not
   * negative (positive under TensorFlow semantics). Required by `clipNorm`;
   * `recordNorm` defaults to the largest f32 (coefficient 1).
   */
  maxNorm?: number;
  /** The order p of the norm: 2 (default), 1, `Infinity` (or `"inf"`), any p > 0. */
  norm?: number | "inf";
  /**
   * `"torch"` (default): coefficient `min(1, maxNorm / (norm + 1e-6))`.
   * `"tensorflow"`: `maxNorm / max(norm, maxNorm)`.
   */
  semantics?: "torch" | "tensorflow";
  /**
   * A NaN or infinite norm leaves the gradients untouched, and
   * `latestReport()` rejects with `NON_FINITE` (`reports()` shows
   * `nonfinite: true`).
   */
  errorIfNonfinite?: boolean;
  /** Clip each tensor by its own norm (`tf.clip_by_norm` per tensor). */
  perTensor?: boolean;
  /** Report every tensor's norm (`tensorNorms`, `namedNorms`). */
  tensorNorms?: boolean;
  /**
   * GradScaler's unscale + inf check + scale update, fused into the clip:
   * the buffer holds `S * g`; the norm is that of `g`; with an inf or NaN
   * the gradients stay as they are and the report says `foundInf` (skip the
   * optimizer step). Record one unscaling clip per step.
   */
  unscale?: boolean;
}

/** Options of {@link Gradients.clipValue}: `value`, or `min` and `max`. */
export interface ClipValueOptions {
  /** Clamp to `[-value, value]` (PyTorch's `clip_grad_value_`). */
  value?: number;
  min?: number;
  max?: number;
}

/** GradScaler's parameters (defaults: PyTorch's). */
export interface LossScalerOptions {
  /** Default 65536. */
  initScale?: number;
  /** Default 2. */
  growthFactor?: number;
  /** Default 0.5. */
  backoffFactor?: number;
  /** Default 2000. */
  growthInterval?: number;
}

/** What one norm clip found and did. */
export interface ClipReport {
  /** Which norm clip of these gradients, counting from 1 (what clipNorm returned). */
  step: number;
  /** Norm of all gradients before clipping (of the unscaled ones when unscaling). */
  totalNorm: number;
  /** The factor the gradients were multiplied by (1: untouched). */
  coefficient: number;
  /** An element was NaN or infinite. */
  nonfinite: boolean;
  /** An unscaling clip found an inf or NaN: skip the step. */
  foundInf: boolean;
  /** The partial given to `clipWithPartial` was invalid: nothing changed. */
  invalidPartial: boolean;
  /** The loss scale this clip divided by (1 if it did not unscale). */
  unscaledBy: number;
  /** The loss scale for the next backward pass. */
  lossScale: number;
  /** Finite steps in a row since the loss scale last changed. */
  growthTracker: number;
  /** This set's 16-byte share of the norm, to combine with other shards' ({@link combinePartials}). */
  partial: Uint8Array;
  /** Each tensor's norm, with `tensorNorms` or `perTensor`; else empty. */
  tensorNorms: number[];
  /** Each tensor's coefficient, alongside `tensorNorms`. */
  tensorCoefficients: number[];
  /** `{ name: norm }`, for named layouts when `tensorNorms` is filled. */
  namedNorms?: Record<string, number>;
}

/** What {@link Gradients.reports} resolves to and {@link Gradients.pollReports} returns. */
export interface Reports {
  /** Every report collected since the last collection, oldest first. */
  reports: ClipReport[];
  /**
   * Steps since the last collection whose report can no longer come: more
   * than {@link REPORT_LOG_LENGTH} steps were submitted between two reads,
   * or their submission was rejected.
   */
  dropped: number;
  /** Of `reports`, those that asked for tensor norms but come without them (a later such clip replaced them before a read). */
  tensorNormsMissed: number;
}

/** A gradient buffer made by the package for a layout, bound to gradclip. */
export interface Gradients {
  /** Every tensor's gradients (usage `STORAGE | COPY_SRC | COPY_DST`). Owned by the package. */
  readonly buffer: GPUBuffer;
  readonly dtype: Dtype;
  /** Size of {@link buffer} in bytes. */
  readonly byteLength: number;
  /** Where each tensor lives, in layout order. */
  readonly tensors: TensorInfo[];
  /**
   * A `GPUBufferBinding` of one tensor, by index or name: its bytes rounded
   * up to a whole 4-byte word. Its offset is a valid binding offset only
   * when the layout was made with a large enough `align`.
   *
   * @throws {GradclipError} `UNKNOWN_TENSOR`, `INVALID_OPTIONS`.
   */
  tensorBinding(tensor: number | string): GPUBufferBinding;
  /**
   * The clip state (declared by {@link CLIP_STATE_WGSL}) as a
   * `GPUBufferBinding`, for an optimizer shader that multiplies by
   * `coefficient` on load instead of a scale pass (use {@link recordNorm}),
   * or a loss shader that reads `loss_scale`. Bind it read-only
   * ({@link clipStateLayoutEntry}); it holds the latest submitted clip's values.
   */
  readonly coefficientBinding: GPUBufferBinding;
  /**
   * Records the norm clip (reduce, coefficient, in-place scale — skipped on
   * the GPU when nothing needs clipping) and submits it now.
   *
   * @returns The step number; its report carries the same.
   * @throws {GradclipError} `INVALID_OPTIONS`, `INVALID_MAX_NORM`,
   *   `INVALID_NORM_ORDER`, `GPU_VALIDATION` (of an earlier call), `DESTROYED`.
   */
  clipNorm(options: ClipNormOptions): number;
  /**
   * Records the norm, the coefficient and the report without touching the
   * gradients (PyTorch's `get_total_norm`), and submits it now: for an
   * optimizer that multiplies by {@link coefficientBinding}.
   */
  recordNorm(options?: ClipNormOptions): number;
  /**
   * Records and submits a norm clip by a norm combined elsewhere: `partial`
   * is {@link combinePartials} of every shard's {@link readPartial} (this
   * one's included). Checked before anything is recorded.
   *
   * @returns The step number.
   * @throws {GradclipError} `INVALID_PARTIAL`, `INVALID_OPTIONS` (not 16
   *   bytes), `INVALID_MAX_NORM`, `INVALID_NORM_ORDER`, `DESTROYED`.
   */
  clipWithPartial(options: ClipNormOptions, partial: Uint8Array): number;
  /**
   * The latest norm clip's step and 16-byte partial (its share of the
   * norm). The copy is submitted when you call this, so submit other work
   * before awaiting it.
   *
   * @throws {GradclipError} `NO_REPORT`, `NOT_SUBMITTED`, `READBACK`, `DESTROYED`.
   */
  readPartial(): Promise<{ step: number; partial: Uint8Array }>;
  /**
   * Clamps every element to `[min, max]` in place (NaN stays NaN), and
   * submits it now. Makes no report.
   *
   * @throws {GradclipError} `INVALID_OPTIONS`, `INVALID_CLAMP_RANGE`, `DESTROYED`.
   */
  clipValue(options: ClipValueOptions): void;
  /**
   * Sets the loss scale to `initScale` and GradScaler's update parameters
   * for the unscaling clips submitted after this call.
   *
   * @throws {GradclipError} `INVALID_OPTIONS`, `INVALID_LOSS_SCALER`, `DESTROYED`.
   */
  setLossScaler(options: LossScalerOptions): void;
  /**
   * The reports whose readback is back, now, without waiting; starts a
   * readback of the steps submitted since the last one, collected by a later
   * call (after an `await`: readbacks come back through the event loop).
   * Call it once per step and no report is lost, and no step waits.
   *
   * @throws {GradclipError} `READBACK`, `GPU_VALIDATION`, `DESTROYED`.
   */
  pollReports(): Reports;
  /**
   * Every report since the last collection (this or {@link pollReports}),
   * oldest first, once a copy of the report log submitted now is back; the
   * steps you submit meanwhile are not waited for.
   *
   * @throws {GradclipError} `READBACK`, `GPU_VALIDATION`, `DESTROYED`.
   */
  reports(): Promise<Reports>;
  /**
   * The report of the latest submitted norm clip.
   *
   * @throws {GradclipError} `NO_REPORT`, `NOT_SUBMITTED`, `NON_FINITE`,
   *   `READBACK`, `GPU_VALIDATION`, `DESTROYED`.
   */
  latestReport(): Promise<ClipReport>;
  /** Destroys {@link buffer}; later calls fail with `DESTROYED`. */
  destroy(): void;
}

/**
 * gradclip's own WGSL for your shaders: `struct ClipState` (the record behind
 * {@link Gradients.coefficientBinding}) and `clip_apply(g: f32, clip:
 * ClipState) -> f32`, which multiplies a gradient exactly as gradclip's
 * scale pass does (factors below the normal range, NaN/inf rules included).
 * Prepend it to an optimizer shader:
 *
 * ```js
 * const code = CLIP_STATE_WGSL + `
 * @group(0) @binding(3) var<storage, read> clip: ClipState;
 * // ... p[i] -= lr * clip_apply(g[i], clip);`;
 * ```
 */
export const CLIP_STATE_WGSL: string;

/** Byte size of the ClipState record (64). */
export const CLIP_STATE_BYTES: number;

/** Steps whose reports the GPU keeps between reads (64). */
export const REPORT_LOG_LENGTH: number;

/**
 * The partial of several shards' partials (all of one norm order): an
 * all-reduce on the host. Loads the wasm module if needed.
 *
 * @param norm The norm order, as in {@link ClipNormOptions.norm} (default 2).
 * @throws {GradclipError} `INVALID_PARTIAL`, `INVALID_OPTIONS`, `INVALID_NORM_ORDER`.
 */
export function combinePartials(partials: Uint8Array[], norm?: number | "inf"): Promise<Uint8Array>;

/**
 * The norm a partial stands for, in float64.
 *
 * @throws {GradclipError} `INVALID_PARTIAL`, `INVALID_OPTIONS`, `INVALID_NORM_ORDER`.
 */
export function partialTotalNorm(partial: Uint8Array, norm?: number | "inf"): Promise<number>;

/** The wasm module's raw exports (for the package's own tests). @internal */
export function internals(): Promise<Record<string, unknown>>;

/**
 * The `GPUBindGroupLayoutEntry` of the coefficient binding: a read-only
 * storage buffer of at least {@link CLIP_STATE_BYTES} bytes.
 *
 * @param visibility Default `GPUShaderStage.COMPUTE`.
 */
export function clipStateLayoutEntry(
  binding: number,
  visibility?: GPUShaderStageFlags,
): GPUBindGroupLayoutEntry;
