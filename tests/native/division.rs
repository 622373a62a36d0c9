//! `shaders/division.wgsl` against the CPU's IEEE f32 division: the clip
//! factor's mantissa quotient must be the one PyTorch's and TensorFlow's f32
//! arithmetic rounds to on every driver. The drivers here divide correctly
//! already, so the correction is driven with estimates a few units off, as
//! NVIDIA's Vulkan driver returned one (and WGSL allows 2.5 units).

use crate::common::{self, adaptive_reference::Rng};
use gradclip::shaders::{F32_BITS, ROUNDED_DIVISION};

/// Per case (nm, dm, estimate bits, 1 = divide with the driver's `/`
/// instead): the quotient's mantissa bits and whether it is below 1.
const HARNESS: &str = "
@group(0) @binding(0) var<storage, read> cases: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> quotients: array<vec2<u32>>;

// Reads cases[i], writes quotients[i]; dispatch (ceil(cases / 64), 1, 1).
@compute @workgroup_size(64)
fn divide_cases(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if i >= arrayLength(&cases) {
        return;
    }
    let c = cases[i];
    let nm = bitcast<f32>(c.x);
    let dm = bitcast<f32>(c.y);
    var q: MantissaQuotient;
    if c.w == 1u {
        q = mantissa_quotient(nm, dm);
    } else {
        q = corrected_quotient(nm, dm, bitcast<f32>(c.z));
    }
    quotients[i] = vec2(bitcast<u32>(q.m), u32(q.below));
}

// Reads pairs[i] (x, y bits), writes divided[i] = rounded_divide(x, y)'s
// bits; dispatch (ceil(pairs / 64), 1, 1).
@group(0) @binding(2) var<storage, read> pairs: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> divided: array<u32>;

@compute @workgroup_size(64)
fn divide_floats(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if i >= arrayLength(&pairs) {
        return;
    }
    divided[i] = bitcast<u32>(rounded_divide(bitcast<f32>(pairs[i].x), bitcast<f32>(pairs[i].y)));
}
";

/// What the shader must return for nm / dm: IEEE's quotient brought into
/// [1, 2), and whether it was below 1.
fn expected(nm: f32, dm: f32) -> (u32, bool) {
    let q = nm / dm;
    let below = q < 1.0;
    ((if below { q * 2.0 } else { q }).to_bits(), below)
}

fn mantissa(bits: u32) -> f32 {
    f32::from_bits(0x3f80_0000 | (bits & 0x007f_ffff))
}

/// Pairs of mantissas: edges of the quotient's range and of the binade
/// change at 1, then random ones.
fn pairs() -> Vec<(f32, f32)> {
    let one = 1.0f32;
    let top = mantissa(0x007f_ffff); // 2 - 2^-23
    let next = mantissa(1);
    let mut v = vec![
        (one, one),
        (top, top),
        (one, top),
        (top, one),
        (next, one),
        (one, next),
        (top, mantissa(0x007f_fffe)),
        (mantissa(0x007f_fffe), top),
        (1.5, 1.25),
        (1.25, 1.5),
        (mantissa(0x0055_5555), 1.5),
    ];
    let mut rng = Rng::new(0x0d1f_1de5);
    for _ in 0..4000 {
        let a = mantissa(rng.next_u64() as u32);
        let b = mantissa(rng.next_u64() as u32);
        v.push((a, b));
        // Neighbours: quotients just below and just above 1.
        v.push((a, mantissa(a.to_bits().wrapping_add(1))));
        v.push((mantissa(a.to_bits().wrapping_add(1)), a));
    }
    v
}

/// Estimates off by these many steps of the f32 bits, either side of the
/// rounded quotient (crossing 1 where it is near).
const OFFSETS: [i32; 12] = [-32, -5, -3, -2, -1, 0, 1, 2, 3, 5, 32, 0];

/// An entry point of the harness and its input binding (the output is
/// the next one).
struct Entry {
    name: &'static str,
    input_binding: u32,
}

const DIVIDE_CASES: Entry = Entry {
    name: "divide_cases",
    input_binding: 0,
};
const DIVIDE_FLOATS: Entry = Entry {
    name: "divide_floats",
    input_binding: 2,
};

/// Runs `entry` over `items` items of `input`; returns `out_words` words of
/// its output binding.
fn run(entry: Entry, input: &[u32], items: usize, out_words: usize) -> Vec<u32> {
    use wgpu::util::DeviceExt;
    let gpu = common::gpu();
    let (device, queue) = (&gpu.device, &gpu.queue);
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let source = format!("{F32_BITS}\n{ROUNDED_DIVISION}\n{HARNESS}");
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("test rounded division"),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("test rounded division"),
        layout: None,
        module: &module,
        entry_point: Some(entry.name),
        compilation_options: Default::default(),
        cache: None,
    });
    let input = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("test division input"),
        contents: bytemuck::cast_slice(input),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let output = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test division output"),
        size: (out_words * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let first = entry.input_binding;
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("test rounded division"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: first,
                resource: input.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: first + 1,
                resource: output.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(items.div_ceil(64) as u32, 1, 1);
    }
    queue.submit([encoder.finish()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        panic!("test division shader: {e}");
    }
    common::download(device, queue, &output, out_words)
        .iter()
        .map(|w| w.to_bits())
        .collect()
}

/// Fails with the count and the first few of the `wrong` results of `total`.
fn assert_none_wrong(wrong: &[String], total: usize) {
    assert!(
        wrong.is_empty(),
        "{} of {total} quotients wrong, first: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
}

#[test]
fn mantissa_quotients_round_as_ieee_division_from_estimates_units_off() {
    let pairs = pairs();
    let mut cases = Vec::new();
    for &(a, b) in &pairs {
        let q = (a / b).to_bits() as i64;
        for (k, &off) in OFFSETS.iter().enumerate() {
            let driver = k == OFFSETS.len() - 1;
            cases.push([
                a.to_bits(),
                b.to_bits(),
                (q + off as i64) as u32,
                driver as u32,
            ]);
        }
    }
    let got = run(
        DIVIDE_CASES,
        cases.as_flattened(),
        cases.len(),
        2 * cases.len(),
    );
    let mut wrong = Vec::new();
    let mut corrected = 0;
    for (c, g) in cases.iter().zip(got.chunks_exact(2)) {
        let (a, b) = (f32::from_bits(c[0]), f32::from_bits(c[1]));
        let (m, below) = expected(a, b);
        if c[2] != (a / b).to_bits() && c[3] == 0 {
            corrected += 1;
        }
        if g[0] != m || g[1] != below as u32 {
            wrong.push(format!(
                "{a:e} / {b:e} from estimate {:e} (driver's / : {}): got {:e} below {}, want {:e} below {below}",
                f32::from_bits(c[2]),
                c[3] == 1,
                f32::from_bits(g[0]),
                g[1],
                f32::from_bits(m),
            ));
        }
    }
    // Every offset but 0 (and the driver's own) is an estimate to correct.
    assert_eq!(
        corrected,
        10 * pairs.len(),
        "estimates that needed correcting"
    );
    assert_none_wrong(&wrong, cases.len());
}

/// rounded_divide puts the mantissa quotient back together with the
/// exponents: every positive normal x / y with a normal quotient must be
/// the CPU's f32 division, and zero, infinite, NaN and negative operands
/// and quotients that overflow what `/` gives.
#[test]
fn rounded_divide_is_ieee_division_across_exponents() {
    let mut rng = Rng::new(0x0f1_0a75);
    let mut pairs: Vec<[u32; 2]> = Vec::new();
    let normal = |rng: &mut Rng, lo: u32, hi: u32| {
        let e = lo + (rng.next_u64() % (hi - lo + 1) as u64) as u32;
        (e << 23) | (rng.next_u64() as u32 & 0x007f_ffff)
    };
    for _ in 0..6000 {
        // Exponents spread over the whole normal range, so quotients also
        // fall outside it (the fallback) and right at its ends.
        pairs.push([normal(&mut rng, 1, 254), normal(&mut rng, 1, 254)]);
        // Quotients near 1, whose exponent depends on `below`.
        let e = normal(&mut rng, 100, 150);
        pairs.push([e, normal(&mut rng, (e >> 23) - 1, (e >> 23) + 1)]);
    }
    let one = 1f32.to_bits();
    let specials = [
        0,
        0x0080_0000,
        0x7f7f_ffff,
        0x7f80_0000,
        0x7fc0_0000,
        0x8000_0000 | one,
    ];
    for &a in &specials {
        for &b in &specials {
            pairs.push([a, b]);
        }
        pairs.push([a, one]);
        pairs.push([one, a]);
    }
    // Subnormal operands and quotients go to `/` unchanged, whose
    // flushing (SwiftShader's) is no subject here.
    let subnormal = |x: f32| x != 0.0 && x.abs() < f32::MIN_POSITIVE;
    pairs.retain(|p| {
        let (x, y) = (f32::from_bits(p[0]), f32::from_bits(p[1]));
        !subnormal(x) && !subnormal(y) && !subnormal(x / y)
    });
    let got = run(
        DIVIDE_FLOATS,
        pairs.as_flattened(),
        pairs.len(),
        pairs.len(),
    );
    let mut wrong = Vec::new();
    for (p, &g) in pairs.iter().zip(&got) {
        let (x, y) = (f32::from_bits(p[0]), f32::from_bits(p[1]));
        let want = x / y;
        let same = g == want.to_bits() || (want.is_nan() && f32::from_bits(g).is_nan());
        if !same {
            wrong.push(format!(
                "{x:e} / {y:e}: got {:e}, want {want:e}",
                f32::from_bits(g)
            ));
        }
    }
    let normal_quotients = pairs
        .iter()
        .filter(|p| (f32::from_bits(p[0]) / f32::from_bits(p[1])).is_normal())
        .count();
    assert!(
        normal_quotients > 6000,
        "too few normal quotients: {normal_quotients}"
    );
    assert_none_wrong(&wrong, pairs.len());
}
