// Declarations shared by every gradclip pass: the one bind-group layout, the
// records the host writes, and the bit-level float helpers. The host prepends
// this file to each pass file to make one shader module per pass. The
// gradients binding (@binding(0)) is declared by the element file of the
// module (elem_*.wgsl), one per element type: the bind-group layout does not
// care about the array's element type, so all modules share it.
//
// WGSL lets compilers assume finite math and flush subnormals, so every test
// for NaN, inf or a magnitude class is done on the integer bits, never with a
// float comparison.

// Invocations per workgroup. The host injects it as a pipeline override from
// the device's limits; it must be a power of two (tree reductions halve it).
override WG: u32 = 256u;

// The longest flat chunk of any set on this device, injected by the host
// (GradSet::chunk_elements is a set's own, never longer); the reduce sizes
// its lists of a chunk's segments from it.
override CHUNK: u32 = 32768u;

// The reduction of the reduce and finalize pipelines: 0 = L2, 1 = Inf,
// 2 = general p. The host makes one pipeline per kind from one entry point.
override KIND: u32 = 0u;

// ClipConfig.semantics
const SEMANTICS_TORCH: u32 = 0u;
const SEMANTICS_TENSORFLOW: u32 = 1u;

// ClipConfig.flags bits
const CFG_TENSOR_NORMS: u32 = 1u;       // compute every tensor's norm
const CFG_PER_TENSOR: u32 = 2u;         // clip each tensor by its own norm
const CFG_NO_SCALE: u32 = 4u;           // norm and coefficient only: leave the gradients alone
const CFG_UNSCALE: u32 = 8u;            // divide by the loss scale, skip on non-finite, update the scale
const CFG_ERROR_IF_NONFINITE: u32 = 16u; // a non-finite norm leaves the gradients untouched
const CFG_SUPPLIED: u32 = 32u;          // the total is cfg.supplied, not a reduction of the gradients
const CFG_KEEP_SCALE: u32 = 64u;        // unscale, but leave the loss scale for a later clip of the step to update

// ClipState.nonfinite / Partial.flags bits
const FLAG_INF: u32 = 1u;
const FLAG_NAN: u32 = 2u;
const FLAG_INVALID: u32 = 4u; // a supplied partial no reduction can produce (ClipState only)

// Reports of the last LOG_LEN steps stay on the GPU, at log[step % LOG_LEN].
const LOG_LEN: u32 = 64u;

// A run of elements of one window: a segment (one tensor's part of one flat
// chunk; `tensor` is that tensor) or a flat chunk (`tensor` is the index of
// its first segment). `start` counts elements from the window's start.
// Stored as three words of the plan table.
struct Chunk {
    start: u32,
    len: u32,
    tensor: u32,
}

// A reduction of some elements, in a form that combines exactly with others:
// one chunk's (in partials), a tensor's, or all of them (Stats.partial, which
// ranks of a sharded model exchange). For L2, v = (small, medium, big) scaled
// sums of squares; for Inf, v.x = bits of max |g|; for general p, v = (s, m,
// E) with the p-th power sum s relative to the largest element m * 2^E.
struct Partial {
    v: vec3<f32>,
    flags: u32,
}

// Per binding window, written once by the host. The plan table holds two
// cuts of the same elements: segments (each one tensor's part of one flat
// chunk) at [0, chunk_count), and flat chunks, which run across tensor
// boundaries, at [chunk_count, chunk_count + flat_count), whose third word is
// the index of their first segment; then, from word ranges_at, each tensor's
// [begin, end) range of segments; from gaps_at, each flat chunk's gap; then
// the split list where the reduce pass fuses some tensors or some are long
// (split_tensor), the long list (long_tensor), and after them, from
// units_at, each flat chunk's unit run (unit_run).
// Partials are indexed like the chunks.
struct WindowInfo {
    chunk_begin: u32,      // this window's segments
    chunk_end: u32,
    chunk_count: u32,      // segments of all windows
    workgroups: u32,       // grid-stride workgroups over segments
    tensor_count: u32,
    flat_begin: u32,       // this window's flat chunks (absolute indices)
    flat_end: u32,
    flat_count: u32,       // flat chunks of all windows
    flat_workgroups: u32,  // grid-stride workgroups over flat chunks (scale, clamp)
    ranges_at: u32,        // word index of the per-tensor partial ranges
    gaps_at: u32,          // word index of the flat chunks' gaps
    split_count: u32,      // tensors of tensor_stats (split_tensor)
    units_at: u32,         // word index of the flat chunks' unit runs (reduce.wgsl's unit_run)
    long_count: u32,       // tensors of tensor_stats' workgroups (long_tensor)
}

// One clip's parameters. The host records a copy of them into this uniform
// at the start of every clip, in the clip's own command stream, so clips
// recorded in any order and submitted in any order each see their own.
struct ClipConfig {
    semantics: u32,
    p: f32,
    max_norm: f32,
    flags: u32,     // CFG_*
    clamp_min: f32,
    clamp_max: f32,
    step: u32,      // low 32 bits of the host's step number
    _pad: u32,
    supplied: Partial,  // the total when flags has CFG_SUPPLIED
}

// ClipState (the clip's result, written by finalize, read by scale and by
// optimizer or loss shaders) is declared in clip_state.wgsl, which every
// module starts with.

// One step's report as kept in the log.
struct LogEntry {
    state: ClipState,
    partial: Partial,
}

// GradScaler's update rule parameters, written by the host (set_loss_scaler).
struct ScalerConfig {
    growth_factor: f32,
    backoff_factor: f32,
    growth_interval: u32,
    _pad: u32,
}

// The plan table (WindowInfo says what it holds), written once at bind.
@group(0) @binding(1) var<storage, read> plan: array<u32>;
// The partials, each Partial's words as one vec4 (load_partial,
// store_partial), as stats.tensors holds each TensorStat: Mesa 22's
// lavapipe splits a struct's store into one per member, and CPU drivers
// scatter every one of them lane by lane (200 000 one-element tensors,
// every tensor's results from the reduce pass: reduce_tensors 2.2 ms with
// struct arrays, 1.8 with vec4s).
@group(0) @binding(2) var<storage, read_write> partials: array<vec4<u32>>;
// A tensor's norm and coefficient (written when per-tensor results are
// asked for: by the reduce pass, or tensor_stats).
struct TensorStat {
    norm: f32,
    coef_mant: f32,
    coef_exp: i32,
    _pad: u32,
}

// Everything finalize leaves on the GPU; `state` comes first so that
// optimizers and loss shaders can bind its 64 bytes alone (at offset 0, which
// satisfies any storage offset alignment).
struct Stats {
    state: ClipState,
    partial: Partial,
    scaler: ScalerConfig,
    tensors_step: u32,  // low 32 bits of the step whose results `tensors` holds
    // cfg.step of the latest clip in which a tensor's factor was not 1
    // (the reduce pass and tensor_stats set it, finalize compares it with its own step)
    tensors_clipped: atomic<u32>,
    log: array<LogEntry, LOG_LEN>,
    tensors: array<vec4<u32>>,  // TensorStat words (tensor_stat, set_tensor_stat)
}

@group(0) @binding(3) var<storage, read_write> stats: Stats;
@group(0) @binding(4) var<uniform> win: WindowInfo;
@group(0) @binding(5) var<uniform> cfg: ClipConfig;

fn load_partial(i: u32) -> Partial {
    let w = partials[i];
    return Partial(bitcast<vec3<f32>>(w.xyz), w.w);
}

fn store_partial(i: u32, q: Partial) {
    partials[i] = vec4(bitcast<vec3<u32>>(q.v), q.flags);
}

fn tensor_stat(i: u32) -> TensorStat {
    let w = stats.tensors[i];
    return TensorStat(bitcast<f32>(w.x), bitcast<f32>(w.y), bitcast<i32>(w.z), w.w);
}

fn set_tensor_stat(i: u32, st: TensorStat) {
    stats.tensors[i] = vec4(bitcast<u32>(st.norm), bitcast<u32>(st.coef_mant), bitcast<u32>(st.coef_exp), st._pad);
}

fn chunk_at(c: u32) -> Chunk {
    let i = 3u * c;
    return Chunk(plan[i], plan[i + 1u], plan[i + 2u]);
}

// Tensor t's partials, as [begin, end).
fn tensor_partials(t: u32) -> vec2<u32> {
    let i = win.ranges_at + 2u * t;
    return vec2(plan[i], plan[i + 1u]);
}

// Whether this clip needs per-tensor results: the host then runs the
// reduce pass's reduce_tensors, which also writes the partials of the
// segments (one tensor's part of one flat chunk) of every flat chunk it
// reads. The global total never depends on it.
fn per_tensor_chunks() -> bool {
    return (cfg.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR)) != 0u;
}

// Whether the scale pass walks segments (to apply each tensor's factor)
// rather than flat chunks.
fn scale_by_tensor() -> bool {
    return (cfg.flags & CFG_PER_TENSOR) != 0u;
}

// This window's flat chunks, as [begin, end) (absolute indices).
fn window_flat() -> vec2<u32> {
    return vec2(win.flat_begin, win.flat_end);
}

// The chunks that the scale and clamp passes walk in this window, as
// [begin, end): segments when clipping per tensor, flat chunks otherwise.
fn window_chunks() -> vec2<u32> {
    if scale_by_tensor() {
        return vec2(win.chunk_begin, win.chunk_end);
    }
    return window_flat();
}

// The flat chunks of all windows, whose partials make the global total
// whatever the clip asks for, as [begin, end).
fn all_chunks() -> vec2<u32> {
    return vec2(win.chunk_count, win.chunk_count + win.flat_count);
}

// The length of the shortest segment of flat chunk c (an absolute index)
// that lies wholly inside it (not its first or last segment), u32 max
// where there is none: plan::Plan::gap.
fn chunk_gap(c: u32) -> u32 {
    return plan[win.gaps_at + c - win.chunk_count];
}

// Entry k of the split list: a tensor whose norm and factor one invocation
// of tensor_stats folds from its segments' partials, any but a fused one
// (the reduce pass gives those theirs: reduce.wgsl's FUSE) or a long one.
// Where none is fused or long the table holds no list, and entry k is
// tensor k: plan::Plan::split.
fn split_tensor(k: u32) -> u32 {
    if win.split_count == win.tensor_count {
        return k;
    }
    return plan[win.gaps_at + win.flat_count + k];
}

// Entry k of the long list: a tensor of more partials than a workgroup has
// invocations, which a workgroup of tensor_stats folds (plan::Plan::long).
// Where there is one, the split list is in the table before it.
fn long_tensor(k: u32) -> u32 {
    return plan[win.gaps_at + win.flat_count + win.split_count + k];
}

// The segments of flat chunk c (an absolute index), as [begin, end): from
// its own third word to the next flat chunk's.
fn flat_segments(c: u32) -> vec2<u32> {
    var end = win.chunk_count;
    if c + 1u < win.chunk_count + win.flat_count {
        end = plan[3u * (c + 1u) + 2u];
    }
    return vec2(plan[3u * c + 2u], end);
}

// Workgroups of the scale and clamp passes' grid-stride dispatches (the
// host dispatches the same number; the reduce pass takes one workgroup per
// flat chunk instead).
fn stride_workgroups() -> u32 {
    return select(win.flat_workgroups, win.workgroups, scale_by_tensor());
}

// Invocations of a team, injected by the host (shaders::TEAM_OVERRIDE,
// no default): the passes cut each run's inner quads into WG / TEAM
// contiguous pieces, one per team of TEAM neighbouring invocations, which
// read it in turns (lane l of a team takes quads l, l + TEAM, ...). On GPUs
// (shaders::GPU_TEAM) loads of neighbouring invocations stay neighbours
// while each team streams one piece. CPU drivers (shaders::CPU_TEAM, one)
// read fastest when each invocation streams a piece of its own: lavapipe
// and llvmpipe run a SIMD group's invocations side by side, and lanes
// reading in turns made their reduce pass 1.5-1.9x slower than lanes each
// reading on from its own last load (docs/bench-cpu-drivers.md). Divides
// every workgroup size the host picks.
override TEAM: u32;

// Invocation t's quads of a run of `quads` quads: the first one, and the
// end of its team's piece (the walk's stride is TEAM).
struct TeamWalk {
    first: u32,
    end: u32,
}

fn team_walk(quads: u32, t: u32) -> TeamWalk {
    let piece = team_piece(quads, t / TEAM);
    return TeamWalk(piece.x + t % TEAM, piece.y);
}

// Quads of a run of `quads` quads in one team's piece (the whole run is cut
// into WG / TEAM of them, each a multiple of TEAM long but the last), as
// [begin, end) from the run's first inner quad.
fn team_piece(quads: u32, team: u32) -> vec2<u32> {
    let begin = min(team * piece_quads(quads), quads);
    return vec2(begin, min(begin + piece_quads(quads), quads));
}

fn piece_quads(quads: u32) -> u32 {
    let teams = WG / TEAM;
    return ((quads + teams - 1u) / teams + TEAM - 1u) / TEAM * TEAM;
}

// A run of window elements [start, end) (a chunk or a segment) as the
// element files' quads (elements 4q .. 4q + 3 of the window): the quads
// wholly inside it, [inner.x, inner.y), which the passes walk with
// team_walk, and its edge quads (the first and last, when it starts or
// ends inside one), which it shares with the runs beside it.
struct Run {
    start: u32,
    end: u32,
    inner: vec2<u32>,
}

fn run_of(start: u32, len: u32) -> Run {
    let end = start + len;
    let first = (start + 3u) / 4u;
    return Run(start, end, vec2(first, max(first, end / 4u)));
}

// Edge quad k of run r (0: the quad the run starts inside, 1: the one it
// ends inside, when that is another quad), and whether the run has it.
struct Edge {
    q: u32,
    has: bool,
}

fn edge(r: Run, k: u32) -> Edge {
    if k == 0u {
        return Edge(r.start / 4u, r.start % 4u != 0u);
    }
    let q = r.end / 4u;
    return Edge(q, r.end % 4u != 0u && q >= r.inner.x);
}

// Bits of a non-finite element, as FLAG_* bits; 0 for finite ones.
fn nonfinite_flags(bits: u32) -> u32 {
    let a = bits & ABS_MASK;
    if a < EXP_MASK {
        return 0u;
    }
    return select(FLAG_NAN, FLAG_INF, a == EXP_MASK);
}

// |x| = m * 2^e with m in [1, 2), subnormals normalised exactly on the bits so
// that a flushing compiler cannot lose them. `a` is a finite, non-zero |x|.
struct Decoded {
    m: f32,
    e: i32,
}

// A subnormal's bits, read as an integer, convert exactly to a normal
// float 2^149 times its value: that float's bits give the mantissa, and its
// exponent less 149. No branch: CPU drivers run both arms of one under a
// lane mask, and the general p reduce decodes every element. Converted as
// a signed integer (the same value below 2^23): the unsigned conversion
// cost SwiftShader's p = 1.5 reduce about a tenth more time.
fn decode(a: u32) -> Decoded {
    let subnormal = a < MIN_NORMAL_BITS;
    let b = select(a, bitcast<u32>(f32(i32(a))), subnormal);
    return Decoded(normal_mantissa(b), i32(b >> 23u) - select(127, 276, subnormal));
}

// The mantissa in [1, 2) of a normal float's bits.
fn normal_mantissa(b: u32) -> f32 {
    return bitcast<f32>(ONE_BITS | (b & MANT_MASK));
}

// x * 2^k by exponent arithmetic on the bits: exact whenever the result is a
// normal float, +-inf above that range. A fast-math compiler may reassociate
// chains of constant multiplies (turning (x * 2^86) * 2^86 into x * inf);
// integer arithmetic it cannot touch. Zero and subnormal x give signed zero.
fn mul_pow2(x: f32, k: i32) -> f32 {
    let bits = bitcast<u32>(x);
    let sign = bits & SIGN_MASK;
    let e = i32((bits >> 23u) & 0xffu);
    let n = e + k;
    if e == 0 || n <= 0 {
        return bitcast<f32>(sign);
    }
    if n >= 255 {
        return bitcast<f32>(sign | POS_INF);
    }
    return bitcast<f32>((bits & ~EXP_MASK) | (u32(n) << 23u));
}

