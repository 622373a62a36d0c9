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
