//! The order of the reduce pass's flat walk, against a CPU model of it.
//!
//! A global norm's bits depend on the order in which the pass adds its
//! terms, and that order is part of what the crate promises: one layout on
//! one adapter gives the same bits whether or not a clip asks for per-tensor
//! results (reduce.wgsl walks a chunk that holds a run of one-element
//! tensors with `reduce_flat_units` then, `plain_quads` otherwise). Whether
//! another order shows in the bits of a whole layout depends on luck: one
//! invocation's different rounding is mostly lost in the workgroup's fold
//! of 32 or 256 shares. So here every element is zero but those of one
//! invocation's share, whose sum then is the global partial, bit for bit,
//! and the sum is compared with [`share_sum`], the order written out on the
//! CPU. Its terms are exact in f32 (elements of 8 significant bits), so
//! only the order of the additions can round differently, and whether the
//! driver fuses a multiply-add cannot matter.

use crate::common;

use common::adaptive_reference::Rng;
use common::{gpu, run_clip};
use gradclip::{shaders, ClipNorm, ClipReport, Norm};

/// The flat chunk length of layouts under 64 chunks, on every adapter.
const CHUNK: usize = 32768;

/// Quads each invocation walks in the last chunk: 4k + 3, so that after its
/// whole steps of `LANES` quads three are left, which `plain_quads` adds to
/// its sum one at a time (and two steps a loop before that).
const SHARE_QUADS: usize = 23;

/// Elements of the first tensor in the last chunk, before the tensors whose
/// walk is checked: the invocation's quads lie among those on CPU adapters
/// (invocation 1 takes quads 23 to 45) and on GPUs (lane 1 of the first
/// team, quads 1 to 177).
const LEAD: usize = 2;

/// One-element tensors of the unit run (elements 2 to 801 of the chunk).
const UNITS: usize = 800;

/// Quads of a step of the walk (reduce.wgsl `LANES`).
const LANES: usize = 4;

/// The invocation whose share holds the data: it also takes the chunk's
/// last edge quad (`team_share`), which starts its second accumulator.
const INVOCATION: usize = 1;

const NORMS: [Norm; 3] = [Norm::L2, Norm::P(3.0), Norm::L1];

/// Invocation t's quads of a run of `quads` quads (common.wgsl `team_walk`):
/// the first, the end, the stride.
fn team_walk(quads: usize, workgroup: usize, team: usize, t: usize) -> (usize, usize, usize) {
    let teams = workgroup / team;
    let piece = quads.div_ceil(teams).div_ceil(team) * team;
    let begin = (t / team * piece).min(quads);
    (begin + t % team, (begin + piece).min(quads), team)
}

/// An element's plain term for `norm`: exact in f32 for the elements of
/// [`element`] (a square has 16 significant bits, a cube 24).
fn term(norm: Norm, x: f32) -> f32 {
    let z = x.abs();
    match norm {
        Norm::L2 => z * z,
        Norm::P(3.0) => z * z * z,
        Norm::L1 => z,
        _ => unreachable!("no plain terms for {norm:?}"),
    }
}

/// `plain_quads` (reduce.wgsl) of one share, element position by element
/// position: the edge quads' terms, the first's then the second's; each
/// whole step of `LANES` quads summed quad after quad (`step_terms`) and
/// added; then the rest quad by quad; the four positions summed pairwise.
fn share_sum(
    norm: Norm,
    quad: impl Fn(usize) -> [f32; 4],
    (first, end, stride): (usize, usize, usize),
    edges: [[f32; 4]; 2],
) -> f32 {
    let mut s: [f32; 4] =
        std::array::from_fn(|l| term(norm, edges[0][l]) + term(norm, edges[1][l]));
    let mut q = first;
    while q + (LANES - 1) * stride < end {
        let step: [[f32; 4]; LANES] = std::array::from_fn(|k| quad(q + k * stride));
        for (l, acc) in s.iter_mut().enumerate() {
            let w = step[1..]
                .iter()
                .fold(term(norm, step[0][l]), |w, z| w + term(norm, z[l]));
            *acc += w;
        }
        q += LANES * stride;
    }
    while q < end {
        for (acc, x) in s.iter_mut().zip(quad(q)) {
            *acc += term(norm, x);
        }
        q += stride;
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// An element of 8 significant bits, random sign, exponent in [-6, 6].
fn element(rng: &mut Rng) -> f32 {
    let r = rng.next_u64();
    let mant = (128 + (r & 127)) as f32 / 128.0;
    let exp = ((r >> 8) % 13) as i32 - 6;
    let sign = if (r >> 32) & 1 == 0 { 1.0 } else { -1.0 };
    sign * mant * 2f32.powi(exp)
}

/// The sum a global partial holds (records.rs `Partial`): L2's middle bin;
/// an integer p's scaled sum times 2^(p e), e its reference exponent.
fn partial_sum(norm: Norm, r: &ClipReport) -> f32 {
    let bytes = r.partial.to_bytes();
    let word = |k: usize| u32::from_le_bytes(bytes[4 * k..4 * k + 4].try_into().unwrap());
    let [x, y, z] = [0, 1, 2].map(|k| f32::from_bits(word(k)));
    assert_eq!(word(3), 0, "{norm:?}: flags in a finite partial");
    match norm {
        Norm::L2 => {
            assert_eq!((x, z), (0.0, 0.0), "L2: a sum outside the middle bin");
            y
        }
        _ => {
            let p = if norm == Norm::L1 { 1 } else { 3 };
            assert_eq!(y, 1.0, "{norm:?}: not a plain integer-p partial");
            x * 2f32.powi(p * z as i32)
        }
    }
}

/// The last chunk's shape on this adapter: its inner quads, which give each
/// invocation SHARE_QUADS a lane, and invocation INVOCATION's walk of them.
fn last_chunk() -> (usize, (usize, usize, usize)) {
    let g = gpu();
    let workgroup = g.clipper.workgroup_size() as usize;
    let team = match g.info.device_type {
        wgpu::DeviceType::Cpu => shaders::CPU_TEAM,
        _ => shaders::GPU_TEAM,
    } as usize;
    let quads = SHARE_QUADS * workgroup / team * team;
    let walk = team_walk(quads, workgroup, team, INVOCATION);
    assert_eq!((walk.1 - walk.0).div_ceil(walk.2), SHARE_QUADS);
    (quads, walk)
}

/// Clips a layout of a tensor that fills the first chunk and runs `LEAD`
/// elements into the last, then the tensors of `inner`, then one that ends
/// two elements past the last chunk's inner quads (an edge quad), with the
/// elements of one invocation's share and that edge quad alone nonzero,
/// and requires the global partial of every clip to be the CPU model's sum.
fn check_walk_order(inner: &[usize]) {
    let (quads, walk) = last_chunk();
    let (first, end, stride) = walk;
    let last = 4 * quads + 2;
    let taken = LEAD + inner.iter().sum::<usize>();
    let sizes: Vec<usize> = [CHUNK + LEAD]
        .into_iter()
        .chain(inner.iter().copied())
        .chain([last - taken])
        .collect();
    assert!(
        4 * (end - stride) + 3 < taken && 4 * first >= LEAD,
        "the share's quads must lie among the tensors of `inner`"
    );
    let mut order_showed = false;
    for seed in 0..6 {
        let mut rng = Rng::new(0x5eed_0000 + seed);
        let mut data = vec![0f32; CHUNK + last];
        let mut quad_of = vec![[0f32; 4]; quads];
        for q in (first..end).step_by(stride) {
            quad_of[q] = std::array::from_fn(|_| element(&mut rng));
            data[CHUNK + 4 * q..CHUNK + 4 * q + 4].copy_from_slice(&quad_of[q]);
        }
        let tail = [element(&mut rng), element(&mut rng), 0.0, 0.0];
        data[CHUNK + 4 * quads..].copy_from_slice(&tail[..2]);
        for norm in NORMS {
            let model = share_sum(norm, |q| quad_of[q], walk, [[0.0; 4], tail]);
            // The same terms one after another: the data must be such that
            // the order shows, or the comparison below could not fail.
            let in_turn = data.iter().fold(0f32, |s, &x| s + term(norm, x));
            order_showed |= in_turn.to_bits() != model.to_bits();
            let base = ClipNorm::new(1e-3).norm(norm);
            for (what, clip) in [
                ("plain", base),
                ("tensor_norms", base.tensor_norms(true)),
                ("per_tensor", base.per_tensor(true)),
            ] {
                let (report, _) = run_clip(&data, &sizes, |set, encoder| {
                    assert_eq!(
                        set.chunk_elements() as usize,
                        CHUNK,
                        "the layout is built for chunks of {CHUNK} elements"
                    );
                    set.clip_norm(encoder, &clip)
                });
                let got = partial_sum(norm, &report.unwrap());
                assert!(
                    got.to_bits() == model.to_bits(),
                    "seed {seed} {norm:?} {what}: the walk summed {got:e} ({:#x}), \
                     the CPU model of its order {model:e} ({:#x})",
                    got.to_bits(),
                    model.to_bits()
                );
            }
        }
    }
    assert!(
        order_showed,
        "no seed's sum depends on the order: the test proves nothing"
    );
}

/// A run of one-element tensors: with per-tensor results the pass walks
/// the chunk with `reduce_flat_units`, in blocks of `LANES` quads.
#[test]
fn chunks_with_a_unit_run_add_in_the_cpu_models_order() {
    check_walk_order(&[1; UNITS]);
}

/// Tensors of 37 to 300 elements, ends inside and outside the share:
/// with per-tensor results the pass walks the chunk with `plain_tracked`,
/// a step of `LANES` quads at a time, in rounds.
#[test]
fn tracked_chunks_add_in_the_cpu_models_order() {
    check_walk_order(&[37, 61, 100, 200, 300, 100]);
}
