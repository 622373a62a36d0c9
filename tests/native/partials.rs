//! Supplied partials: the CPU (`NormPartial::from_bytes`, `check`,
//! `total_norm`) and the GPU (`clip_with_partial_from`) accept exactly the
//! same bytes and agree on the norm of every one they accept.

use crate::common;

use common::{assert_no_wgpu_errors, download, gpu, upload};
use gradclip::{ClipNorm, Error, GradLayout, Norm, NormPartial};
use wgpu::util::DeviceExt;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 16) as u32
    }
    fn float(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next() as f32 / u32::MAX as f32)
    }
}

/// 16-byte records: partials that reductions of `norm` produce, and the same
/// with one bit flipped, a flag bit set, or a value made negative or huge.
fn candidates(norm: Norm, rng: &mut Rng, n: usize) -> Vec<[u32; 4]> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let v: [f32; 3] = match norm {
            Norm::Inf => [rng.float(0.0, 1e30), 0.0, 0.0],
            Norm::L2 => [
                rng.float(0.0, 1e30),
                rng.float(0.0, 1e30),
                rng.float(0.0, 1e10),
            ],
            _ => [
                rng.float(1.0, 1e6),
                rng.float(1.0, 1.999),
                (rng.next() % 277) as f32 - 149.0,
            ],
        };
        let mut w = [
            v[0].to_bits(),
            v[1].to_bits(),
            v[2].to_bits(),
            rng.next() % 4,
        ];
        match rng.next() % 6 {
            0 => {}
            1 => w[(rng.next() % 4) as usize] ^= 1 << (rng.next() % 32),
            2 => w[3] |= 1 << (2 + rng.next() % 30),
            3 => w[(rng.next() % 3) as usize] |= 0x8000_0000,
            4 => {
                w[(rng.next() % 3) as usize] =
                    [0x7f80_0000, 0x7fc0_0000, 0, 0x8000_0000][(rng.next() % 4) as usize]
            }
            _ => w[(rng.next() % 3) as usize] = rng.next(),
        }
        out.push(w);
    }
    out
}

/// What the CPU makes of the bytes: the norm, or why they are rejected.
fn cpu_norm(words: [u32; 4], norm: Norm) -> Result<f64, Error> {
    let bytes: [u8; 16] = bytemuck::cast(words);
    let partial = NormPartial::from_bytes(bytes)?;
    partial.total_norm(norm)
}

#[test]
fn gpu_and_cpu_agree_on_every_supplied_partial() {
    let g = gpu();
    let data = [3.0f32, 4.0];
    let buffer = upload(&g.device, &data);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[2]).unwrap())
        .unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut rejected) = (0, 0);
    for norm in [Norm::L2, Norm::Inf, Norm::L1, Norm::P(3.0), Norm::P(0.5)] {
        // One batch fits the report log (64 steps), so nothing is dropped.
        let records = candidates(norm, &mut rng, 64);
        let source = g
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("supplied partials"),
                contents: bytemuck::cast_slice(&records),
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        // max_norm f32::MAX: no finite norm clips, so every step sees [3, 4].
        let clip = ClipNorm::new(f32::MAX).norm(norm).error_if_nonfinite(true);
        let mut encoder = g.device.create_command_encoder(&Default::default());
        for i in 0..records.len() {
            set.clip_with_partial_from(&mut encoder, &clip, &source, 16 * i as u64)
                .unwrap();
        }
        g.queue.submit([encoder.finish()]);
        let taken = pollster::block_on(set.take_reports()).unwrap();
        assert_eq!(
            (taken.reports.len(), taken.dropped),
            (records.len(), 0),
            "{norm:?} steps {:?}",
            taken.reports.iter().map(|r| r.step).collect::<Vec<_>>()
        );
        for (report, &words) in taken.reports.iter().zip(&records) {
            let what = format!("{norm:?} {words:08x?}");
            match cpu_norm(words, norm) {
                Err(Error::InvalidPartial(_)) => {
                    rejected += 1;
                    assert!(
                        report.invalid_partial,
                        "{what}: the CPU rejects it, the GPU reported {report:?}"
                    );
                }
                Err(e) => panic!("{what}: unexpected CPU error {e}"),
                Ok(want) => {
                    accepted += 1;
                    let got = report.total_norm as f64;
                    let want32 = want as f32 as f64;
                    let agree = (got.is_nan() && want.is_nan())
                        || got == want32
                        || (got - want).abs() <= 2e-6 * want.abs();
                    assert!(agree, "{what}: GPU {got}, CPU {want}");
                    assert!(!report.invalid_partial, "{what}: {report:?}");
                }
            }
        }
        // Rejected bytes leave the gradients bit for bit as they were.
        let bad: Vec<[u32; 4]> = records
            .iter()
            .copied()
            .filter(|&w| cpu_norm(w, norm).is_err())
            .collect();
        let fresh = upload(&g.device, &data);
        let untouched = g
            .clipper
            .bind(&fresh, &GradLayout::from_sizes(&[2]).unwrap())
            .unwrap();
        let source = g
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("rejected partials"),
                contents: bytemuck::cast_slice(&bad),
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let mut encoder = g.device.create_command_encoder(&Default::default());
        for i in 0..bad.len() {
            untouched
                .clip_with_partial_from(
                    &mut encoder,
                    &ClipNorm::new(0.0).norm(norm),
                    &source,
                    16 * i as u64,
                )
                .unwrap();
        }
        g.queue.submit([encoder.finish()]);
        assert_eq!(download(&g.device, &g.queue, &fresh, 2), data, "{norm:?}");
    }
    assert!(
        accepted > 50 && rejected > 50,
        "{accepted} accepted, {rejected} rejected"
    );
    assert_no_wgpu_errors();
}

#[test]
fn host_partials_are_checked_before_recording() {
    let g = gpu();
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[2]).unwrap())
        .unwrap();
    // A stray flag bit: no reduction sets it.
    let stray: [u8; 16] = bytemuck::cast([1e15f32.to_bits(), 0, 0, 1 << 7]);
    assert!(matches!(
        NormPartial::from_bytes(stray),
        Err(Error::InvalidPartial(_))
    ));
    // Valid bytes for L2, not for L1 (a p-sum is at least 1 with m in [1, 2)).
    let l2_only: [u8; 16] = bytemuck::cast([0.25f32.to_bits(), 0, 0, 0]);
    let partial = NormPartial::from_bytes(l2_only).unwrap();
    let mut encoder = g.device.create_command_encoder(&Default::default());
    assert!(matches!(
        set.clip_with_partial(&mut encoder, &ClipNorm::new(1.0).norm(Norm::L1), &partial),
        Err(Error::InvalidPartial(_))
    ));
    set.clip_with_partial(&mut encoder, &ClipNorm::new(1.0), &partial)
        .unwrap();
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report()).unwrap();
    let want = partial.total_norm(Norm::L2).unwrap();
    assert_eq!(report.total_norm as f64, want);
    assert_eq!(report.step, 1, "the rejected call recorded nothing");
    assert_no_wgpu_errors();
}
