//! Mixed precision: f16 and bf16 gradients (native and packed paths), the
//! fused GradScaler unscale + inf check + clip, the loss-scale update on the
//! GPU, and one clip over f32 and bf16 buffers together. Every expectation is
//! computed in float64 from the exact decoded inputs, with the `half` crate
//! (not gradclip's WGSL) as the decoder and round-to-nearest-even encoder.

use crate::common;

use common::reference::{self, Order};
use common::{assert_no_wgpu_errors, gpu, rel_diff, GRAD_USAGE};
use gradclip::{ClipNorm, ClipReport, ElementPath, Error, GradLayout, GradType, LossScaler};
use half::{bf16, f16};
use wgpu::util::DeviceExt;

/// A 16-bit element type, on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Half {
    F16,
    Bf16,
}

impl Half {
    fn grad_type(self) -> GradType {
        match self {
            Half::F16 => GradType::F16,
            Half::Bf16 => GradType::Bf16,
        }
    }
    fn decode(self, bits: u16) -> f64 {
        match self {
            Half::F16 => f16::from_bits(bits).to_f64(),
            Half::Bf16 => bf16::from_bits(bits).to_f64(),
        }
    }
    /// Round to nearest even, from float64 (one rounding).
    fn encode(self, x: f64) -> u16 {
        match self {
            Half::F16 => f16::from_f64(x).to_bits(),
            Half::Bf16 => bf16::from_f64(x).to_bits(),
        }
    }
    fn exponent_mask(self) -> u16 {
        match self {
            Half::F16 => 0x7c00,
            Half::Bf16 => 0x7f80,
        }
    }
    fn max_bits(self) -> u16 {
        match self {
            Half::F16 => 0x7bff,  // 65504
            Half::Bf16 => 0x7f7f, // 3.39e38
        }
    }
}

/// Distance in units in the last place between two finite values of one
/// 16-bit type (sign-magnitude bits mapped to a monotone integer line).
fn ulps(a: u16, b: u16) -> u32 {
    let line = |x: u16| -> i32 {
        if x & 0x8000 != 0 {
            -((x & 0x7fff) as i32)
        } else {
            x as i32
        }
    };
    (line(a) - line(b)).unsigned_abs()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random finite elements of `ty` covering the whole range: random bit
/// patterns (so every exponent, subnormals included), exact zeros of both
/// signs, and the largest and smallest magnitudes. For bf16, whose range is
/// f32's, one element has the largest magnitude and the random ones stay
/// below 2^97, so that the norm (just under `f32::MAX`) is an f32; norms
/// beyond f32 are tested on their own.
fn finite_bits(ty: Half, n: usize, seed: u64) -> Vec<u16> {
    let mut rng = Rng(seed | 1);
    let (second_max, top_exponent) = match ty {
        Half::F16 => (0x8000 | ty.max_bits(), 0x7c00),
        Half::Bf16 => (0xc000, 0x7000), // -2; exponent field below 2^97
    };
    let special = [0x0001u16, 0x8001, 0x0000, 0x8000, ty.max_bits(), second_max];
    (0..n)
        .map(|i| {
            if i < special.len() {
                return special[i];
            }
            loop {
                let b = rng.next() as u16;
                if b & ty.exponent_mask() < top_exponent {
                    return b;
                }
            }
        })
        .collect()
}

fn decoded(ty: Half, bits: &[u16]) -> Vec<f32> {
    // Every f16 and bf16 value is an f32, so the f32 reference applies exactly.
    bits.iter().map(|&b| ty.decode(b) as f32).collect()
}

/// A buffer of exactly `bytes`: the misuse checks need its size, and the
/// 16-bit paths do not depend on where it ends.
fn buffer(bytes: &[u8]) -> wgpu::Buffer {
    common::buffers::upload_exact(&gpu().device, bytes)
}

fn read_bytes(buffer: &wgpu::Buffer) -> Vec<u8> {
    let g = gpu();
    let words = common::download_all(&g.device, &g.queue, buffer);
    bytemuck::cast_slice(&words).to_vec()
}

/// Packs tensors of `ty` as `bind_as` expects: each at an even element, an
/// odd tensor followed by one padding element holding `pad`.
fn pack(layout: &GradLayout, ty: Half, bits: &[u16], pad: u16) -> Vec<u16> {
    let mut out = vec![pad; layout.packed_elements(ty.grad_type()) as usize];
    for t in 0..layout.len() {
        let r = layout.range(t);
        let p = layout.packed_range(t, ty.grad_type());
        out[p.start as usize..p.end as usize]
            .copy_from_slice(&bits[r.start as usize..r.end as usize]);
    }
    out
}

fn unpack(layout: &GradLayout, ty: Half, packed: &[u16]) -> Vec<u16> {
    (0..layout.len())
        .flat_map(|t| {
            let p = layout.packed_range(t, ty.grad_type());
            packed[p.start as usize..p.end as usize].to_vec()
        })
        .collect()
}

/// The clippers whose paths for `ty` differ: the default one (native f16
/// where the device has shader-f16) and, for f16 on such a device, the one
/// forced onto the packed path. Elsewhere both take the same path (bf16 is
/// always packed), and a second run would compile the same pipelines again
/// to prove nothing.
fn clippers(ty: Half) -> Vec<(&'static str, gradclip::Clipper)> {
    let mut all = vec![("default", gpu().clipper.clone())];
    if let (Half::F16, Some(packed)) = (ty, common::forced_packed_clipper()) {
        all.push(("packed", packed.clone()));
    }
    all
}

const SIZES: [usize; 6] = [1, 7, 8192 * 2 + 3, 0, 1000, 20_001];

/// Binds `bits` packed as `ty`, records `clip`, returns the report and the
/// tensors' bits afterwards, and checks the padding elements kept their bits.
fn run(
    clipper: &gradclip::Clipper,
    ty: Half,
    sizes: &[usize],
    bits: &[u16],
    clip: &ClipNorm,
    scaler: Option<&LossScaler>,
) -> (ClipReport, Vec<u16>, Vec<ElementPath>) {
    let g = gpu();
    let layout = GradLayout::from_sizes(sizes).unwrap();
    const PAD: u16 = 0x7e01; // a NaN: if a pass read a padding half, norms would be NaN
    let packed = pack(&layout, ty, bits, PAD);
    let buf = buffer(bytemuck::cast_slice(&packed));
    let set = clipper.bind_as(&buf, &layout, ty.grad_type()).unwrap();
    if let Some(s) = scaler {
        set.set_loss_scaler(s).unwrap();
    }
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, clip).unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    let after: Vec<u16> = bytemuck::cast_slice(&read_bytes(&buf)[..2 * packed.len()]).to_vec();
    for t in 0..layout.len() {
        let p = layout.packed_range(t, ty.grad_type());
        if p.end % 2 == 1 {
            assert_eq!(
                after[p.end as usize], PAD,
                "{ty:?}: padding after tensor {t} changed"
            );
        }
    }
    assert_no_wgpu_errors();
    (
        report,
        unpack(&layout, ty, &after),
        set.element_paths().to_vec(),
    )
}

fn expected_path(clipper_name: &str, ty: Half) -> ElementPath {
    let g = gpu();
    match ty {
        Half::Bf16 => ElementPath::Bf16Packed,
        Half::F16
            if clipper_name == "default"
                && g.device.features().contains(wgpu::Features::SHADER_F16) =>
        {
            ElementPath::F16Native
        }
        Half::F16 => ElementPath::F16Packed,
    }
}

#[test]
fn gl_and_forced_clippers_take_the_packed_f16_path() {
    let g = gpu();
    let packed = gradclip::Clipper::without_shader_f16(&g.device, &g.queue).unwrap();
    assert_eq!(packed.f16_path(), ElementPath::F16Packed);
    if g.info.backend == wgpu::Backend::Gl {
        // wgpu's GL backend has no shader-f16.
        assert!(!g.device.features().contains(wgpu::Features::SHADER_F16));
        assert_eq!(g.clipper.f16_path(), ElementPath::F16Packed);
    }
    if g.device.features().contains(wgpu::Features::SHADER_F16) {
        assert_eq!(g.clipper.f16_path(), ElementPath::F16Native);
    }
    eprintln!(
        "default f16 path on {:?}: {:?}",
        g.info.backend,
        g.clipper.f16_path()
    );
}

#[test]
fn norms_of_random_16_bit_data_match_float64() {
    let total: usize = SIZES.iter().sum();
    for ty in [Half::F16, Half::Bf16] {
        let bits = finite_bits(ty, total, 0x5eed + ty as u64);
        let values = decoded(ty, &bits);
        for (name, clipper) in clippers(ty) {
            for order in [Order::L2, Order::Inf, Order::P(1.0), Order::P(3.0)] {
                let clip = ClipNorm::new(1.0).norm(order.to_norm());
                let (report, _, paths) = run(&clipper, ty, &SIZES, &bits, &clip, None);
                assert_eq!(paths, [expected_path(name, ty)]);
                let want = reference::norm(&values, order);
                if matches!(order, Order::Inf) {
                    // Exact: the decoded largest magnitude, bit for bit.
                    assert_eq!(report.total_norm as f64, want, "{ty:?} {name} Inf");
                }
                assert!(
                    rel_diff(report.total_norm as f64, want) <= 1e-5,
                    "{ty:?} {name} {order:?}: got {}, want {want}",
                    report.total_norm
                );
                assert!(!report.nonfinite);
            }
        }
    }
}

/// Hundreds of tensors of 16 to 600 elements, even counts so that no
/// padding parts them: flat chunks of several segments each, which the
/// reduce pass folds during its flat walk (reduce.wgsl, tracked_round) on
/// every 16-bit load path. Each tensor's L2, Inf and p = 3 norm against float64,
/// and the global norm's bits with and without them.
#[test]
fn per_tensor_norms_of_hundreds_of_16_bit_tensors_match_float64() {
    let mut rng = Rng(0x7e57_ab1e);
    let sizes: Vec<usize> = (0..400)
        .map(|_| 2 * (8 + (rng.next() % 293) as usize))
        .collect();
    let total = sizes.iter().sum();
    for ty in [Half::F16, Half::Bf16] {
        // Magnitudes below 2, down to subnormal.
        let bits: Vec<u16> = finite_bits(ty, total, 0xc0ffee + ty as u64)
            .into_iter()
            .map(|b| b & 0xbfff)
            .collect();
        let values = decoded(ty, &bits);
        for (name, clipper) in clippers(ty) {
            for order in [Order::L2, Order::Inf, Order::P(3.0)] {
                let clip = ClipNorm::new(f32::MAX).norm(order.to_norm());
                let (plain, _, _) = run(&clipper, ty, &sizes, &bits, &clip, None);
                let logged = clip.tensor_norms(true);
                let (logged, _, _) = run(&clipper, ty, &sizes, &bits, &logged, None);
                let what = format!("{ty:?} {name} {order:?}");
                assert_eq!(
                    plain.total_norm.to_bits(),
                    logged.total_norm.to_bits(),
                    "{what}: tensor_norms moved the global norm"
                );
                reference::assert_tensor_norms(
                    &logged.tensor_norms,
                    &values,
                    &sizes,
                    order,
                    1e-5,
                    &what,
                );
            }
        }
    }
}

#[test]
fn subnormal_only_data_keeps_its_norm() {
    // Only subnormals: a path that flushed them would report 0.
    for ty in [Half::F16, Half::Bf16] {
        let bits: Vec<u16> = (1..=0x3ffu16).chain([0x8001, 0x83ff]).collect();
        let want = reference::norm(&decoded(ty, &bits), Order::L2);
        for (name, clipper) in clippers(ty) {
            let (report, ..) = run(
                &clipper,
                ty,
                &[bits.len()],
                &bits,
                &ClipNorm::new(1.0),
                None,
            );
            assert!(
                rel_diff(report.total_norm as f64, want) <= 1e-5,
                "{ty:?} {name}: got {}, want {want}",
                report.total_norm
            );
        }
    }
}

#[test]
fn clipped_16_bit_gradients_are_rounded_to_nearest_even_within_one_ulp() {
    let total: usize = SIZES.iter().sum();
    for ty in [Half::F16, Half::Bf16] {
        let bits = finite_bits(ty, total, 0xc11f + ty as u64);
        let values = decoded(ty, &bits);
        let norm = reference::norm(&values, Order::L2);
        for (name, clipper) in clippers(ty) {
            let max_norm = (norm / 3.0) as f32;
            let (report, after, _) =
                run(&clipper, ty, &SIZES, &bits, &ClipNorm::new(max_norm), None);
            let coef = report.coefficient as f64;
            assert!(rel_diff(coef, reference::torch_coefficient(norm, max_norm as f64)) <= 1e-5);
            let (mut exact, mut normal) = (0, 0);
            for (i, (&got, &g)) in after.iter().zip(&bits).enumerate() {
                let want = ty.encode(ty.decode(g) * coef);
                let close = ulps(got, want) <= 1
                    // A device may flush an f32 subnormal product (bf16 has them).
                    || (ty.decode(got) - ty.decode(want)).abs() <= f32::MIN_POSITIVE as f64;
                assert!(
                    close,
                    "{ty:?} {name}: element {i}: got {got:#06x}, want {want:#06x}"
                );
                // Rounding is judged where no flush can intervene: input and
                // product in f32's normal range (SwiftShader flushes the rest).
                let tiny = |x: f64| x != 0.0 && x.abs() < f32::MIN_POSITIVE as f64;
                if !tiny(ty.decode(g)) && !tiny(ty.decode(g) * coef) {
                    normal += 1;
                    exact += usize::from(got == want);
                }
            }
            // One f32 rounding before the 16-bit one: ties of the second are rare.
            assert!(
                exact * 1000 >= normal * 999 && normal * 10 >= after.len() * 9,
                "{ty:?} {name}: {exact} of {normal} normal-range elements exact ({} in all)",
                after.len()
            );
        }
    }
}

/// Clamp bounds are f32s; a clamped element is the bound rounded to the
/// element type, so `clip_value` shows the encoder's rounding exactly,
/// halfway cases included (the scale pass's products rarely land on one).
#[test]
fn clamped_bounds_round_to_nearest_even_exactly() {
    let g = gpu();
    let p = |e: i32| 2f32.powi(e);
    let mut bounds: Vec<(Half, f32)> = [
        1.0 + p(-11),       // halfway, even below
        1.0 + 3.0 * p(-11), // halfway, even above
        1.5 * p(-24),       // subnormal halfway: up to 2^-23
        p(-25),             // halfway to the smallest subnormal: 0
        p(-25) * 1.0001,    // just above: 2^-24
        1023.5 * p(-24),    // largest subnormal / smallest normal halfway
        65519.996,          // below the overflow halfway: 65504
        65520.0,            // halfway past 65504 (odd): inf
        0.1,
        3.0e-5,
    ]
    .iter()
    .map(|&b| (Half::F16, b))
    .collect();
    bounds.extend(
        [
            1.0 + p(-8),                 // halfway, even below
            1.0 + 3.0 * p(-8),           // halfway, even above
            f32::from_bits(0x7f7f_8000), // halfway past bf16's largest (odd): inf
            f32::from_bits(0x0000_8000), // subnormal halfway
            f32::from_bits(0x0001_8000),
            0.1,
        ]
        .iter()
        .map(|&b| (Half::Bf16, b)),
    );
    let mut rng = Rng(4242);
    for ty in [Half::F16, Half::Bf16] {
        for _ in 0..24 {
            // Random f32s in the type's range, many with long mantissas.
            let e = if ty == Half::F16 {
                (rng.next() % 42) as i32 - 26
            } else {
                (rng.next() % 250) as i32 - 130
            };
            let m = 1.0 + (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
            bounds.push((ty, m * p(e)));
        }
    }
    for &(ty, b) in &bounds {
        for (name, clipper) in clippers(ty) {
            let inf = ty.exponent_mask();
            let bits = [inf, 0x8000 | inf, ty.max_bits(), 0x8000 | ty.max_bits()];
            let buf = buffer(bytemuck::cast_slice(&bits));
            let set = clipper
                .bind_as(&buf, &GradLayout::from_sizes(&[4]).unwrap(), ty.grad_type())
                .unwrap();
            let mut encoder = g.device.create_command_encoder(&Default::default());
            set.clip_value(&mut encoder, -b, b).unwrap();
            g.queue.submit([encoder.finish()]);
            let after: Vec<u16> = bytemuck::cast_slice(&read_bytes(&buf)).to_vec();
            let want = match ty {
                Half::F16 => [f16::from_f32(b).to_bits(), f16::from_f32(-b).to_bits()],
                Half::Bf16 => [bf16::from_f32(b).to_bits(), bf16::from_f32(-b).to_bits()],
            };
            assert_eq!(
                [after[0], after[1]],
                want,
                "{ty:?} {name}: bound {b:e} ({:#010x})",
                b.to_bits()
            );
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn native_and_packed_f16_paths_agree_bit_for_bit() {
    let total: usize = SIZES.iter().sum();
    let bits = finite_bits(Half::F16, total, 0xabcd);
    let clip = ClipNorm::new(10.0);
    let clippers = clippers(Half::F16);
    if clippers.len() == 1 {
        eprintln!("no shader-f16: the packed f16 path is the only one");
        return;
    }
    let runs: Vec<(ClipReport, Vec<u16>)> = clippers
        .iter()
        .map(|(_, c)| {
            let (r, after, _) = run(c, Half::F16, &SIZES, &bits, &clip, None);
            (r, after)
        })
        .collect();
    assert_eq!(
        runs[0].0.total_norm.to_bits(),
        runs[1].0.total_norm.to_bits()
    );
    assert_eq!(runs[0].1, runs[1].1);
}

#[test]
fn norm_beyond_the_f16_range_is_right() {
    // 10 000 elements of 60 000: the norm, 6e6, is far beyond f16's 65504.
    let bits = vec![f16::from_f32(60000.0).to_bits(); 10_000];
    let want = 60000f64.to_bits(); // 60000 is exact in f16
    assert_eq!(f16::from_bits(bits[0]).to_f64().to_bits(), want);
    for (name, clipper) in clippers(Half::F16) {
        let (report, after, _) = run(
            &clipper,
            Half::F16,
            &[10_000],
            &bits,
            &ClipNorm::new(1.0),
            None,
        );
        assert!(
            rel_diff(report.total_norm as f64, 6e6) <= 1e-6,
            "{name}: {}",
            report.total_norm
        );
        let one = Half::F16.encode(60000.0 * (1.0 / (6e6 + 1e-6)));
        assert!(after.iter().all(|&b| ulps(b, one) <= 1), "{name}");
    }
}

#[test]
fn bf16_norm_beyond_f32_still_clips_right() {
    // Four elements of bf16's largest value: the norm, twice f32::MAX, is
    // reported as inf but the coefficient comes from its exact scaled form.
    // (max_norm 1e38 keeps the coefficient a normal f32: GL flushes subnormals.)
    let max = Half::Bf16.decode(Half::Bf16.max_bits());
    let bits = vec![Half::Bf16.max_bits(); 4];
    for (name, clipper) in clippers(Half::Bf16) {
        let (report, after, _) = run(
            &clipper,
            Half::Bf16,
            &[4],
            &bits,
            &ClipNorm::new(1e38),
            None,
        );
        assert_eq!(report.total_norm, f32::INFINITY, "{name}");
        assert!(!report.nonfinite, "{name}: no element was inf");
        let coef = 1e38f32 as f64 / (2.0 * max);
        assert!(rel_diff(report.coefficient as f64, coef) <= 1e-6, "{name}");
        let want = Half::Bf16.encode(max * coef);
        assert!(
            after.iter().all(|&b| ulps(b, want) <= 1),
            "{name}: {after:x?}"
        );
    }
}

#[test]
fn nonfinite_16_bit_elements_follow_pytorch() {
    for ty in [Half::F16, Half::Bf16] {
        let inf = ty.exponent_mask();
        let nan = ty.exponent_mask() | 0x41;
        let mut bits = finite_bits(ty, 5000, 7);
        bits[1234] = inf;
        for (name, clipper) in clippers(ty) {
            let (report, after, _) = run(
                &clipper,
                ty,
                &[3001, 1999],
                &bits,
                &ClipNorm::new(1.0),
                None,
            );
            assert!(
                report.nonfinite && report.total_norm == f32::INFINITY,
                "{ty:?} {name}"
            );
            assert!(!report.found_inf, "only unscaling clips set found_inf");
            // Finite -> signed zero, inf -> NaN.
            for (i, (&got, &g)) in after.iter().zip(&bits).enumerate() {
                if i == 1234 {
                    assert!(ty.decode(got).is_nan(), "{ty:?} {name}");
                } else {
                    assert_eq!(got, g & 0x8000, "{ty:?} {name}: element {i}");
                }
            }
        }
        bits[4000] = nan;
        let (report, after, _) = run(
            &gpu().clipper,
            ty,
            &[3001, 1999],
            &bits,
            &ClipNorm::new(1.0),
            None,
        );
        assert!(report.total_norm.is_nan());
        assert!(
            after.iter().all(|&b| ty.decode(b).is_nan()),
            "{ty:?}: NaN norm makes all NaN"
        );
    }
}

/// Unscale then clip on the host in float64, rounding to the element type
/// after each step as PyTorch's GradScaler.unscale_ + clip_grad_norm_ do.
fn unscale_then_clip(ty: Half, bits: &[u16], scale: f64, max_norm: f64) -> (f64, Vec<u16>) {
    let unscaled: Vec<u16> = bits
        .iter()
        .map(|&b| ty.encode(ty.decode(b) / scale))
        .collect();
    let norm = reference::norm(&decoded(ty, &unscaled), Order::L2);
    let coef = reference::torch_coefficient(norm, max_norm);
    (
        norm,
        unscaled
            .iter()
            .map(|&u| ty.encode(ty.decode(u) * coef))
            .collect(),
    )
}

#[test]
fn fused_unscale_and_clip_equals_unscale_then_clip_within_one_ulp() {
    let sizes = [5000, 3, 12_345];
    let total: usize = sizes.iter().sum();
    for ty in [Half::F16, Half::Bf16] {
        for scale in [1024.0f32, 65536.0, 3.0] {
            // Scaled gradients S * g that stay normal once divided by S.
            let mut rng = Rng(99 + scale as u64);
            let bits: Vec<u16> = (0..total)
                .map(|_| {
                    let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                    ty.encode(u * 0.5 * scale as f64 + 0.01 * scale as f64)
                })
                .collect();
            let (norm, want) = unscale_then_clip(ty, &bits, scale as f64, 1.0);
            for (name, clipper) in clippers(ty) {
                let scaler = LossScaler::new().init_scale(scale);
                let clip = ClipNorm::new(1.0).unscale(true);
                let (report, after, _) = run(&clipper, ty, &sizes, &bits, &clip, Some(&scaler));
                let what = format!("{ty:?} {name} S={scale}");
                assert!(!report.found_inf && !report.nonfinite, "{what}");
                assert_eq!(report.unscaled_by, scale, "{what}");
                assert!(
                    rel_diff(report.total_norm as f64, norm) <= 1e-3,
                    "{what}: norm {} vs {norm}",
                    report.total_norm
                );
                // The exact norm of g / S (no rounding to the type in between).
                let exact = reference::norm(&decoded(ty, &bits), Order::L2) / scale as f64;
                assert!(rel_diff(report.total_norm as f64, exact) <= 1e-5, "{what}");
                assert!(
                    rel_diff(
                        report.coefficient as f64 * scale as f64,
                        reference::torch_coefficient(exact, 1.0)
                    ) <= 1e-5,
                    "{what}: coefficient is clip / S"
                );
                for (i, (&got, &w)) in after.iter().zip(&want).enumerate() {
                    assert!(
                        ulps(got, w) <= 1,
                        "{what}: element {i}: got {got:#06x}, want {w:#06x}"
                    );
                }
            }
        }
    }
}

#[test]
fn found_inf_leaves_gradients_untouched_and_backs_off() {
    for ty in [Half::F16, Half::Bf16] {
        for bad in [
            ty.exponent_mask(),
            0x8000 | ty.exponent_mask(),
            ty.exponent_mask() | 1,
        ] {
            let mut bits = finite_bits(ty, 3000, 3);
            bits[2999] = bad;
            for (name, clipper) in clippers(ty) {
                let clip = ClipNorm::new(1.0).unscale(true);
                let (report, after, _) = run(&clipper, ty, &[1000, 2000], &bits, &clip, None);
                let what = format!("{ty:?} {name} {bad:#x}");
                assert!(report.found_inf && report.nonfinite, "{what}");
                assert_eq!(report.coefficient, 1.0, "{what}");
                assert_eq!(after, bits, "{what}: gradients must be left as they are");
                assert_eq!(
                    (report.unscaled_by, report.loss_scale),
                    (65536.0, 32768.0),
                    "{what}"
                );
                assert_eq!(report.growth_tracker, 0);
            }
        }
    }
}

/// GradScaler.update, from torch's `_amp_update_scale_` kernel, in f32 as it is.
fn gradscaler_update(scale: f32, tracker: u32, found_inf: bool, s: &LossScaler) -> (f32, u32) {
    if found_inf {
        return (scale * s.backoff_factor_value(), 0);
    }
    let successful = tracker + 1;
    if successful == s.growth_interval_value() {
        let grown = scale * s.growth_factor_value();
        (if grown.is_finite() { grown } else { scale }, 0)
    } else {
        (scale, successful)
    }
}

/// Runs `steps` unscaling clips on f32 + bf16 gradients with infs injected
/// where `inject(step)` says, checking every step against GradScaler's rules.
fn loss_scale_sequence(scaler: LossScaler, steps: u64, inject: impl Fn(u64) -> Option<u16>) {
    let g = gpu();
    let layout = GradLayout::from_sizes(&[300, 301]).unwrap();
    let master = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("master f32"),
        size: 1200,
        usage: GRAD_USAGE,
        mapped_at_creation: false,
    });
    let half = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bf16"),
        size: 604,
        usage: GRAD_USAGE,
        mapped_at_creation: false,
    });
    let set = g
        .clipper
        .bind_ranges_as(
            &layout,
            &[
                (master.as_entire_buffer_binding(), GradType::F32),
                (
                    wgpu::BufferBinding {
                        buffer: &half,
                        offset: 0,
                        size: wgpu::BufferSize::new(602),
                    },
                    GradType::Bf16,
                ),
            ],
        )
        .unwrap();
    set.set_loss_scaler(&scaler).unwrap();
    let (mut scale, mut tracker) = (scaler.init_scale_value(), 0u32);
    let mut reports = Vec::new();
    for step in 0..steps {
        let f: Vec<f32> = (0..300).map(|i| ((i + step) % 13) as f32 - 6.0).collect();
        let mut b: Vec<u16> = (0..302)
            .map(|i| bf16::from_f32(((i * 7 + step) % 11) as f32).to_bits())
            .collect();
        if let Some(bad) = inject(step) {
            b[(step as usize * 37) % 301] = bad;
        }
        g.queue.write_buffer(&master, 0, bytemuck::cast_slice(&f));
        g.queue.write_buffer(&half, 0, bytemuck::cast_slice(&b));
        let mut encoder = g.device.create_command_encoder(&Default::default());
        set.clip_norm(&mut encoder, &ClipNorm::new(1.0).unscale(true))
            .unwrap();
        g.queue.submit([encoder.finish()]);
        if step % 8 == 7 || step + 1 == steps {
            let taken = pollster::block_on(set.take_reports()).unwrap();
            assert_eq!(taken.dropped, 0);
            reports.extend(taken.reports);
        }
    }
    assert_eq!(reports.len() as u64, steps);
    for (step, report) in reports.iter().enumerate() {
        let found = inject(step as u64).is_some();
        assert_eq!(report.found_inf, found, "step {step}");
        assert_eq!(
            report.unscaled_by.to_bits(),
            scale.to_bits(),
            "step {step}: S used"
        );
        (scale, tracker) = gradscaler_update(scale, tracker, found, &scaler);
        assert_eq!(
            (report.loss_scale.to_bits(), report.growth_tracker),
            (scale.to_bits(), tracker),
            "step {step}: S {} vs {scale}",
            report.loss_scale
        );
    }
    assert_no_wgpu_errors();
}

#[test]
fn loss_scale_follows_gradscaler_over_50_steps() {
    let scaler = LossScaler::new().init_scale(1024.0).growth_interval(4);
    let infs = [3u64, 4, 11, 12, 13, 30, 47];
    loss_scale_sequence(scaler, 50, |step| {
        infs.contains(&step)
            .then_some(if step % 2 == 0 { 0x7f80 } else { 0xffc1 })
    });
}

#[test]
fn loss_scale_with_other_factors_and_no_growth_past_f32() {
    let scaler = LossScaler::new()
        .init_scale(2f32.powi(125))
        .growth_factor(3.0)
        .backoff_factor(0.25)
        .growth_interval(1);
    loss_scale_sequence(scaler, 12, |step| (step == 6).then_some(0x7f80));
}

#[test]
fn one_clip_over_an_f32_and_a_bf16_buffer() {
    let g = gpu();
    let f: Vec<f32> = (0..10_001)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.37)
        .collect();
    let b_bits: Vec<u16> = finite_bits(Half::Bf16, 7001, 17)
        .into_iter()
        .map(|b| b & 0xbfff) // magnitudes below 2: the f32 part matters too
        .collect();
    let master = buffer(bytemuck::cast_slice(&f));
    let mut b_packed = b_bits.clone();
    b_packed.push(0x7fc1); // padding: a NaN nobody may read
    let half = buffer(bytemuck::cast_slice(&b_packed));
    let layout = GradLayout::from_named(&[("master", f.len()), ("bf16", b_bits.len())]).unwrap();
    let set = g
        .clipper
        .bind_ranges_as(
            &layout,
            &[
                (master.as_entire_buffer_binding(), GradType::F32),
                (
                    wgpu::BufferBinding {
                        buffer: &half,
                        offset: 0,
                        size: wgpu::BufferSize::new(2 * 7001),
                    },
                    GradType::Bf16,
                ),
            ],
        )
        .unwrap();
    // 10 001 f32s end inside a 16-byte quad, where the buffer ends too.
    assert_eq!(
        set.element_paths(),
        [ElementPath::F32Unaligned, ElementPath::Bf16Packed]
    );
    let all: Vec<f32> = f
        .iter()
        .copied()
        .chain(decoded(Half::Bf16, &b_bits))
        .collect();
    let norm = reference::norm(&all, Order::L2);
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.clip_norm(&mut encoder, &ClipNorm::new(1.0).tensor_norms(true))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    assert!(rel_diff(report.total_norm as f64, norm) <= 1e-5);
    assert!(
        rel_diff(
            report.tensor_norms[0] as f64,
            reference::norm(&f, Order::L2)
        ) <= 1e-5
    );
    let coef = report.coefficient as f64;
    let f_after = common::download(&g.device, &g.queue, &master, f.len());
    reference::assert_close(
        &f_after,
        &reference::torch_clipped(&f, norm, 1.0),
        1e-6,
        "f32 part",
    );
    let b_after: Vec<u16> = bytemuck::cast_slice(&read_bytes(&half)).to_vec();
    assert_eq!(b_after[7001], 0x7fc1, "padding half untouched");
    for (i, (&got, &orig)) in b_after.iter().zip(&b_bits).enumerate() {
        let want = Half::Bf16.encode(Half::Bf16.decode(orig) * coef);
        assert!(
            ulps(got, want) <= 1
                || (Half::Bf16.decode(got) - Half::Bf16.decode(want)).abs()
                    <= f32::MIN_POSITIVE as f64,
            "bf16 element {i}: got {got:#06x}, want {want:#06x}"
        );
    }
    assert_no_wgpu_errors();
}

#[test]
fn misuse_of_16_bit_ranges_and_scalers_is_an_error() {
    let g = gpu();
    let buf = buffer(&[0u8; 64]);
    let layout = GradLayout::from_sizes(&[3]).unwrap();
    let at = |offset, size| wgpu::BufferBinding {
        buffer: &buf,
        offset,
        size: wgpu::BufferSize::new(size),
    };
    // An odd element offset would share a word with whatever is before it.
    assert_eq!(
        g.clipper
            .bind_ranges_as(&layout, &[(at(2, 6), GradType::F16)])
            .unwrap_err(),
        Error::MisalignedTensor {
            tensor: 0,
            offset: 2
        }
    );
    // 3 f16 at byte 56 end at 62: the word up to 64 fits; at 60 it would not.
    assert!(g
        .clipper
        .bind_ranges_as(&layout, &[(at(56, 6), GradType::F16)])
        .is_ok());
    let small = buffer(&[0u8; 6]); // create_buffer_init pads this buffer to 8 bytes
    let tight = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("6 bytes"),
        size: 6,
        usage: GRAD_USAGE,
        mapped_at_creation: false,
    });
    drop(small);
    assert_eq!(
        g.clipper
            .bind_ranges_as(
                &layout,
                &[(
                    wgpu::BufferBinding {
                        buffer: &tight,
                        offset: 0,
                        size: wgpu::BufferSize::new(6)
                    },
                    GradType::Bf16
                )]
            )
            .unwrap_err(),
        Error::LayoutExceedsBuffer {
            needed: 8,
            buffer_size: 6
        }
    );
    assert_eq!(
        g.clipper
            .bind_ranges_as(&layout, &[(at(0, 12), GradType::F16)])
            .unwrap_err(),
        Error::RangeMismatch {
            tensor: 0,
            range_bytes: 12,
            layout_bytes: 6
        }
    );
    // bind_as pads: [3, 2] in f16 needs 6 elements = 12 bytes.
    let two = GradLayout::from_sizes(&[3, 2]).unwrap();
    let eleven = buffer(&[0u8; 12]);
    assert!(g.clipper.bind_as(&eleven, &two, GradType::F16).is_ok());
    assert_eq!(
        g.clipper
            .bind_as(&buffer(&[0u8; 8]), &two, GradType::Bf16)
            .unwrap_err(),
        Error::LayoutExceedsBuffer {
            needed: 12,
            buffer_size: 8
        }
    );

    let set = g.clipper.bind_as(&eleven, &two, GradType::F16).unwrap();
    for bad in [
        LossScaler::new().init_scale(0.0),
        LossScaler::new().init_scale(f32::INFINITY),
        LossScaler::new().init_scale(-1.0),
        LossScaler::new().growth_factor(1.0),
        LossScaler::new().growth_factor(f32::NAN),
        LossScaler::new().backoff_factor(1.0),
        LossScaler::new().backoff_factor(0.0),
        LossScaler::new().growth_interval(0),
    ] {
        assert!(
            matches!(set.set_loss_scaler(&bad), Err(Error::InvalidLossScaler(_))),
            "{bad:?}"
        );
    }
    // Rejected scalers changed nothing: the default 2^16 is still in place.
    let mut encoder = g.device.create_command_encoder(&Default::default());
    set.record_norm(&mut encoder, &ClipNorm::new(1.0).unscale(true))
        .unwrap();
    g.queue.submit([encoder.finish()]);
    assert_eq!(
        pollster::block_on(set.read_report()).unwrap().unscaled_by,
        65536.0
    );
    assert_no_wgpu_errors();
}

#[test]
fn per_tensor_clipping_divides_each_coefficient_by_the_scale() {
    let sizes = [3000, 501, 7000];
    let scale = 512.0f32;
    let mut rng = Rng(77);
    let mut bits = Vec::new();
    for (t, &n) in sizes.iter().enumerate() {
        let magnitude = [0.001, 0.5, 0.05][t] * scale as f64;
        bits.extend((0..n).map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            Half::F16.encode(u * magnitude)
        }));
    }
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let clip = ClipNorm::new(1.0).per_tensor(true).unscale(true);
    for (name, clipper) in clippers(Half::F16) {
        let (report, after, _) = run(
            &clipper,
            Half::F16,
            &sizes,
            &bits,
            &clip,
            Some(&LossScaler::new().init_scale(scale)),
        );
        for t in 0..sizes.len() {
            let r = layout.range(t);
            let tensor = &bits[r.start as usize..r.end as usize];
            let norm = reference::norm(&decoded(Half::F16, tensor), Order::L2) / scale as f64;
            let coef = reference::torch_coefficient(norm, 1.0);
            assert!(
                rel_diff(report.tensor_norms[t] as f64, norm) <= 1e-5,
                "{name} tensor {t}"
            );
            assert!(
                rel_diff(report.tensor_coefficients[t] as f64, coef / scale as f64) <= 1e-5,
                "{name} tensor {t}: the factor applied is clip / S"
            );
            for (i, &g) in tensor.iter().enumerate() {
                let want = Half::F16.encode(Half::F16.decode(g) / scale as f64 * coef);
                let got = after[r.start as usize + i];
                assert!(
                    ulps(got, want) <= 1,
                    "{name} tensor {t} element {i}: {got:#x} vs {want:#x}"
                );
            }
        }
    }
}

#[test]
fn sharded_unscaling_clip_agrees_across_ranks() {
    // Two ranks (f16 and bf16 shards) exchange raw partials; each unscales
    // the combined one, so all reach the same norm, found_inf and scale.
    let g = gpu();
    let scale = 4096.0f32;
    for inject in [false, true] {
        let a: Vec<u16> = (0..4001)
            .map(|i| Half::F16.encode(((i % 17) as f64 - 8.0) * 300.0))
            .collect();
        let mut b: Vec<u16> = (0..2000)
            .map(|i| Half::Bf16.encode(((i % 5) as f64 - 2.0) * 900.0))
            .collect();
        if inject {
            b[1500] = 0xff80; // -inf on rank 1 only
        }
        let mut a_padded = a.clone();
        a_padded.push(0);
        let shards = [
            (Half::F16, a_padded, 4001usize),
            (Half::Bf16, b.clone(), 2000),
        ];
        let buffers: Vec<wgpu::Buffer> = shards
            .iter()
            .map(|s| buffer(bytemuck::cast_slice(&s.1)))
            .collect();
        let sets: Vec<gradclip::GradSet> = shards
            .iter()
            .zip(&buffers)
            .map(|(s, buf)| {
                let set = g
                    .clipper
                    .bind_as(
                        buf,
                        &GradLayout::from_sizes(&[s.2]).unwrap(),
                        s.0.grad_type(),
                    )
                    .unwrap();
                set.set_loss_scaler(&LossScaler::new().init_scale(scale))
                    .unwrap();
                set
            })
            .collect();
        let clip = ClipNorm::new(1.0);
        let mut partials = Vec::new();
        for set in &sets {
            let mut encoder = g.device.create_command_encoder(&Default::default());
            set.record_norm(&mut encoder, &clip).unwrap();
            g.queue.submit([encoder.finish()]);
            partials.push(pollster::block_on(set.read_report()).unwrap().partial);
        }
        let combined = gradclip::NormPartial::combine(&partials, gradclip::Norm::L2).unwrap();
        let source = g
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("combined partial"),
                contents: &combined.to_bytes(),
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let all: Vec<f32> = decoded(Half::F16, &a)
            .into_iter()
            .chain(decoded(Half::Bf16, &b))
            .collect();
        let norm = reference::norm(&all, Order::L2) / scale as f64;
        for (rank, set) in sets.iter().enumerate() {
            let mut encoder = g.device.create_command_encoder(&Default::default());
            set.clip_with_partial_from(&mut encoder, &clip.unscale(true), &source, 0)
                .unwrap();
            g.queue.submit([encoder.finish()]);
            let report = pollster::block_on(set.read_report()).unwrap();
            let what = format!("rank {rank}, inf injected: {inject}");
            assert_eq!(report.found_inf, inject, "{what}");
            assert_eq!(
                report.loss_scale,
                if inject { scale / 2.0 } else { scale },
                "{what}"
            );
            assert_eq!(report.unscaled_by, scale, "{what}");
            if inject {
                assert_eq!(report.coefficient, 1.0, "{what}");
                let after: Vec<u16> = bytemuck::cast_slice(&read_bytes(&buffers[rank])).to_vec();
                assert_eq!(
                    after[..shards[rank].2],
                    shards[rank].1[..shards[rank].2],
                    "{what}: untouched"
                );
            } else {
                assert!(rel_diff(report.total_norm as f64, norm) <= 1e-5, "{what}");
                let coef = reference::torch_coefficient(norm, 1.0) / scale as f64;
                assert!(rel_diff(report.coefficient as f64, coef) <= 1e-5, "{what}");
            }
        }
    }
    assert_no_wgpu_errors();
}

#[test]
fn unscaling_works_for_every_norm_order() {
    let bits = finite_bits(Half::F16, 9000, 5150);
    let values = decoded(Half::F16, &bits);
    for scale in [65536.0f32, 0.75] {
        for order in [Order::L2, Order::Inf, Order::P(1.0), Order::P(3.0)] {
            for (name, clipper) in clippers(Half::F16) {
                let clip = ClipNorm::new(1.0).norm(order.to_norm()).unscale(true);
                let scaler = LossScaler::new().init_scale(scale);
                let (report, ..) = run(
                    &clipper,
                    Half::F16,
                    &[4000, 5000],
                    &bits,
                    &clip,
                    Some(&scaler),
                );
                let want = reference::norm(&values, order) / scale as f64;
                let what = format!("{name} {order:?} S={scale}");
                if matches!(order, Order::Inf) && scale == 65536.0 {
                    // Exponent arithmetic: exact for a power-of-two scale.
                    assert_eq!(report.total_norm as f64, want, "{what}");
                }
                assert!(
                    rel_diff(report.total_norm as f64, want) <= 1e-5,
                    "{what}: {} vs {want}",
                    report.total_norm
                );
                let coef = reference::torch_coefficient(want, 1.0) / scale as f64;
                assert!(rel_diff(report.coefficient as f64, coef) <= 1e-5, "{what}");
            }
        }
    }
}

#[test]
fn sixteen_bit_buffers_split_into_windows_on_word_boundaries() {
    // A device binding at most 1 MiB: a 3 M-element 16-bit buffer is cut
    // into several windows, with odd-sized tensors straddling boundaries.
    let (adapter_device, _, _) = pollster::block_on(gradclip::default_device()).unwrap();
    let mut limits = adapter_device.limits();
    let features = adapter_device.features();
    drop(adapter_device);
    limits.max_storage_buffer_binding_size = 1 << 20;
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .unwrap();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("small-binding device"),
        required_limits: limits,
        required_features: features & wgpu::Features::SHADER_F16,
        ..Default::default()
    }))
    .unwrap();
    common::watch_errors(&device);
    let sizes = [524_287, 524_289, 1, 1_000_001, 0, 950_711];
    let layout = GradLayout::from_sizes(&sizes).unwrap();
    let n: usize = sizes.iter().sum();
    // The default clipper, and one on the packed path where f16's differs
    // (bf16 always takes the packed one).
    let default = gradclip::Clipper::new(&device, &queue).unwrap();
    let forced = common::forced_packed_clipper_of(&device, &queue);
    for ty in [Half::F16, Half::Bf16] {
        let bits: Vec<u16> = finite_bits(ty, n, 31 + ty as u64)
            .into_iter()
            .map(|b| b & !0x4000) // magnitudes below 2: no single element dominates
            .collect();
        let values = decoded(ty, &bits);
        let norm = reference::norm(&values, Order::L2);
        let max_norm = (norm / 2.0) as f32;
        let forced = forced.as_ref().filter(|_| ty == Half::F16);
        for clipper in [Some(&default), forced].into_iter().flatten() {
            const PAD: u16 = 0x7e01;
            let packed = pack(&layout, ty, &bits, PAD);
            let buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("windowed 16-bit gradients"),
                contents: bytemuck::cast_slice(&packed),
                usage: GRAD_USAGE,
            });
            let set = clipper.bind_as(&buf, &layout, ty.grad_type()).unwrap();
            let what = format!("{ty:?} {:?}", set.element_paths());
            assert!(
                set.window_count() >= 6,
                "{what}: {} windows",
                set.window_count()
            );
            let mut encoder = device.create_command_encoder(&Default::default());
            set.clip_norm(&mut encoder, &ClipNorm::new(max_norm))
                .unwrap();
            queue.submit([encoder.finish()]);
            let report = pollster::block_on(set.read_report()).unwrap();
            assert!(rel_diff(report.total_norm as f64, norm) <= 1e-5, "{what}");
            let words = common::download(&device, &queue, &buf, packed.len().div_ceil(2));
            let after_packed: Vec<u16> = bytemuck::cast_slice(&words)[..packed.len()].to_vec();
            for t in 0..layout.len() {
                let p = layout.packed_range(t, ty.grad_type());
                if p.end % 2 == 1 {
                    assert_eq!(
                        after_packed[p.end as usize], PAD,
                        "{what}: padding of tensor {t}"
                    );
                }
            }
            let after = unpack(&layout, ty, &after_packed);
            let coef = report.coefficient as f64;
            for (i, (&got, &g)) in after.iter().zip(&bits).enumerate() {
                let want = ty.encode(ty.decode(g) * coef);
                let close = ulps(got, want) <= 1
                    || (ty.decode(got) - ty.decode(want)).abs() <= f32::MIN_POSITIVE as f64;
                assert!(
                    close,
                    "{what}: element {i}: got {got:#06x}, want {want:#06x}"
                );
            }
        }
    }
    common::assert_no_wgpu_errors();
}
