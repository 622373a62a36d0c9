//! Tensor-size layouts shared by the native and the browser suites.

/// Runs of one-element tensors (the reduce pass's unit runs, reduce.wgsl
/// unit_stats), each `(lead, run)` a tensor of `lead` elements followed by
/// `run` one-element tensors, then a tensor of `last` elements.
pub fn unit_runs(runs: &[(usize, usize)], last: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    for &(lead, run) in runs {
        sizes.push(lead);
        sizes.extend(std::iter::repeat_n(1, run));
    }
    sizes.push(last);
    sizes
}

/// One tensor of `chunks` chunks of `chunk` elements: a 4096 first and a 1
/// at the start of every other chunk, zeros elsewhere. Each chunk's sum of
/// squares is exact, so orders of folding the chunks' partials differ only
/// in which 1s round away against 2^24 (front to back, every one does):
/// any order but finalize's shows in the tensor's norm.
pub fn spiked_chunks(chunks: usize, chunk: usize) -> Vec<f32> {
    let mut spikes = vec![0f32; chunks * chunk];
    for i in (0..spikes.len()).step_by(chunk) {
        spikes[i] = 1.0;
    }
    spikes[0] = 4096.0;
    spikes
}
