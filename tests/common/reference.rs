//! The float64 CPU reference: what every GPU result is compared against.

/// Norm order, as in `gradclip::Norm` but for the reference.
#[derive(Clone, Copy, Debug)]
pub enum Order {
    L2,
    Inf,
    P(f64),
}

impl Order {
    pub fn to_norm(self) -> gradclip::Norm {
        match self {
            Order::L2 => gradclip::Norm::L2,
            Order::Inf => gradclip::Norm::Inf,
            Order::P(1.0) => gradclip::Norm::L1,
            Order::P(p) => gradclip::Norm::P(p as f32),
        }
    }
}

/// The norm of the concatenated gradients in float64, scaled by the largest
/// magnitude so that nothing over- or underflows. NaN if any element is NaN,
/// inf if any is infinite (NaN wins, as in PyTorch).
pub fn norm(data: &[f32], order: Order) -> f64 {
    if data.iter().any(|g| g.is_nan()) {
        return f64::NAN;
    }
    if data.iter().any(|g| g.is_infinite()) {
        return f64::INFINITY;
    }
    let top = data.iter().fold(0.0f64, |m, &g| m.max((g as f64).abs()));
    if top == 0.0 {
        return 0.0;
    }
    match order {
        Order::Inf => top,
        Order::L2 => {
            top * data
                .iter()
                .map(|&g| (g as f64 / top).powi(2))
                .sum::<f64>()
                .sqrt()
        }
        Order::P(p) => {
            top * data
                .iter()
                .map(|&g| (g as f64 / top).abs().powf(p))
                .sum::<f64>()
                .powf(1.0 / p)
        }
    }
}

/// PyTorch's coefficient for a norm; NaN for a NaN norm, 0 for an infinite one.
pub fn torch_coefficient(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// What PyTorch's `clip_grad_norm_` leaves, computed from an exact norm.
pub fn torch_clipped(data: &[f32], norm: f64, max_norm: f64) -> Vec<f32> {
    if norm.is_nan() {
        return vec![f32::NAN; data.len()];
    }
    let coef = torch_coefficient(norm, max_norm);
    data.iter().map(|&g| (g as f64 * coef) as f32).collect()
}

/// TensorFlow's `clip_by_global_norm` from an exact norm.
pub fn tensorflow_clipped(data: &[f32], norm: f64, clip_norm: f64) -> Vec<f32> {
    if !norm.is_finite() {
        return vec![f32::NAN; data.len()];
    }
    let coef = clip_norm * (1.0 / norm).min(1.0 / clip_norm);
    data.iter().map(|&g| (g as f64 * coef) as f32).collect()
}

/// Each tensor's float64 norm under `order` (the tensors of `sizes` laid
/// end to end in `data`), and the gradients after clipping each tensor by
/// its own norm to `max_norm` (PyTorch's rule, or TensorFlow's
/// `clip_by_norm`).
pub fn per_tensor_reference(
    data: &[f32],
    sizes: &[usize],
    order: Order,
    max_norm: f32,
    tensorflow: bool,
) -> (Vec<f64>, Vec<f32>) {
    let mut norms = Vec::with_capacity(sizes.len());
    let mut want = Vec::with_capacity(data.len());
    let mut start = 0;
    for &n in sizes {
        let tensor = &data[start..start + n];
        start += n;
        let norm = norm(tensor, order);
        want.extend(if tensorflow && norm > 0.0 {
            tensorflow_clipped(tensor, norm, max_norm as f64)
        } else if tensorflow {
            tensor.to_vec()
        } else {
            torch_clipped(tensor, norm, max_norm as f64)
        });
        norms.push(norm);
    }
    (norms, want)
}

/// Asserts that `got` holds, in layout order, the norm of each tensor of
/// `sizes` laid end to end in `data`, each within relative `tol` of its
/// float64 norm; returns those float64 norms.
pub fn assert_tensor_norms(
    got: &[f32],
    data: &[f32],
    sizes: &[usize],
    order: Order,
    tol: f64,
    what: &str,
) -> Vec<f64> {
    assert_eq!(got.len(), sizes.len(), "{what}: tensor count");
    let mut start = 0;
    let mut wants = Vec::with_capacity(sizes.len());
    for (t, (&n, &g)) in sizes.iter().zip(got).enumerate() {
        let want = norm(&data[start..start + n], order);
        assert!(
            rel_diff(g as f64, want) <= tol,
            "{what}: tensor {t} ({n} elements) norm {g} vs {want}"
        );
        wants.push(want);
        start += n;
    }
    wants
}

/// Asserts two gradient vectors agree: relative `tol`, an absolute slack of
/// the smallest normal f32 (GPUs may flush subnormal results), NaN where NaN.
pub fn assert_close(got: &[f32], want: &[f32], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            ((g as f64) - (w as f64)).abs() <= tol * (w as f64).abs() + f32::MIN_POSITIVE as f64
        };
        assert!(ok, "{what}: element {i}: got {g:e}, want {w:e}");
    }
}

/// Asserts bit-for-bit equality (NaN payloads aside).
pub fn assert_identical(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            g.to_bits() == w.to_bits()
        };
        assert!(
            ok,
            "{what}: element {i}: got {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Relative difference, with NaN equal to NaN and equal infinities equal.
pub fn rel_diff(got: f64, want: f64) -> f64 {
    if got.is_nan() && want.is_nan() || got == want {
        return 0.0;
    }
    (got - want).abs() / want.abs().max(f64::MIN_POSITIVE)
}
