//! One GradSet shared by many threads (it is Sync): every submission is
//! accepted, and every step's report is delivered once or counted as dropped.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Mutex;

use common::{assert_no_wgpu_errors, download, gpu, upload};
use gradclip::{ClipNorm, GradLayout};

#[test]
fn sixteen_threads_share_one_set() {
    const THREADS: usize = 16;
    const STEPS: usize = 100;
    let g = gpu();
    let buffer = upload(&g.device, &[3.0, 4.0]);
    let set = g
        .clipper
        .bind(&buffer, &GradLayout::from_sizes(&[2]).unwrap())
        .unwrap();
    let seen = Mutex::new(Vec::new());
    let dropped = Mutex::new(0u64);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (set, seen, dropped) = (&set, &seen, &dropped);
            scope.spawn(move || {
                for k in 0..STEPS {
                    let mut encoder = g.device.create_command_encoder(&Default::default());
                    set.clip_norm(&mut encoder, &ClipNorm::new(10.0)).unwrap();
                    g.queue.submit([encoder.finish()]);
                    // Half the threads collect as they go, some read the latest.
                    if t % 2 == 0 {
                        let got = set.poll_reports().unwrap();
                        seen.lock()
                            .unwrap()
                            .extend(got.reports.iter().map(|r| r.step));
                        *dropped.lock().unwrap() += got.dropped;
                    } else if k % 10 == 0 {
                        let latest = pollster::block_on(set.read_report()).unwrap();
                        assert_eq!(latest.total_norm, 5.0);
                    }
                }
            });
        }
    });
    let rest = pollster::block_on(set.take_reports()).unwrap();
    let mut seen = seen.into_inner().unwrap();
    seen.extend(rest.reports.iter().map(|r| r.step));
    let dropped = dropped.into_inner().unwrap() + rest.dropped;
    let distinct: BTreeSet<u64> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), seen.len(), "a report delivered twice");
    assert_eq!(
        seen.len() as u64 + dropped,
        (THREADS * STEPS) as u64,
        "{} reports and {dropped} dropped",
        seen.len()
    );
    assert_eq!(*distinct.last().unwrap(), (THREADS * STEPS) as u64);
    assert_eq!(download(&g.device, &g.queue, &buffer, 2), [3.0, 4.0]);
    assert_no_wgpu_errors();
}
