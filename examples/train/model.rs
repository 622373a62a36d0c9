//! The demo's model on the host: its dimensions, its parameter layout, its
//! initialisation, and a float64 CPU reference of one step's loss and
//! gradients that the GPU passes in `rnn.wgsl` are tested against.

/// Sizes and hyperparameters of a training run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Hidden units (the workgroup size of `forward_backward`; at most 256).
    pub hidden: u32,
    /// Sequences per step.
    pub batch: u32,
    /// Time steps per sequence.
    pub seq_len: u32,
    /// The loss counts time steps `t >= loss_from`.
    pub loss_from: u32,
    /// SGD learning rate.
    pub lr: f32,
    /// Spectral scale of the initial recurrent weights: above 1 the
    /// gradients of back-propagation through time explode.
    pub gain: f32,
    /// Seed of the initial weights and of the data.
    pub seed: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            hidden: 32,
            batch: 32,
            seq_len: 64,
            loss_from: 10,
            lr: 0.2,
            gain: 1.5,
            seed: 7,
        }
    }
}

impl Config {
    /// Element counts of the parameter tensors W, U, b, V, c, in buffer order.
    pub fn tensor_sizes(&self) -> [usize; 5] {
        let h = self.hidden as usize;
        [h, h * h, h, h, 1]
    }

    pub fn param_count(&self) -> usize {
        self.tensor_sizes().iter().sum()
    }

    /// Floats of the activation scratch buffer (see `rnn.wgsl`).
    pub fn acts_len(&self) -> usize {
        let bt = (self.batch * self.seq_len) as usize;
        2 * bt * self.hidden as usize + 2 * bt
    }

    /// The initial parameters: W ~ N(0, 1), U ~ N(0, gain^2 / H), b = 0,
    /// V ~ N(0, 1 / H), c = 0, from `seed`.
    pub fn initial_params(&self) -> Vec<f32> {
        let h = self.hidden as usize;
        let mut state = hash(self.seed ^ 0x5eed_1234);
        let mut normal = move || {
            // Irwin-Hall: the sum of 12 uniforms minus 6 is close enough to N(0, 1).
            let mut s = 0.0f32;
            for _ in 0..12 {
                state = hash(state.wrapping_add(0x9e37_79b9));
                s += (state >> 8) as f32 / 16_777_216.0;
            }
            s - 6.0
        };
        let u_scale = self.gain / (h as f32).sqrt();
        let v_scale = 1.0 / (h as f32).sqrt();
        let mut p = Vec::with_capacity(self.param_count());
        p.extend((0..h).map(|_| normal()));
        p.extend((0..h * h).map(|_| normal() * u_scale));
        p.extend(std::iter::repeat_n(0.0, h));
        p.extend((0..h).map(|_| normal() * v_scale));
        p.push(0.0);
        p
    }
}

/// The lowbias32 hash, as `hash` in `rnn.wgsl`.
pub fn hash(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Input `t` of sequence `b` at `step`, as `input_at` in `rnn.wgsl`.
#[cfg(test)]
pub fn input(seed: u32, step: u32, b: u32, t: u32) -> f32 {
    let h = hash(seed ^ hash(step ^ hash(b ^ hash(t))));
    (h >> 8) as f32 * (2.0 / 16_777_216.0) - 1.0
}

/// Loss and gradients of one step in float64: what `forward_backward`
/// followed by `gradients` computes in float32.
#[cfg(test)]
pub fn reference_step(cfg: &Config, params: &[f32], step: u32) -> (f64, Vec<f64>) {
    let h = cfg.hidden as usize;
    let t_len = cfg.seq_len as usize;
    let p: Vec<f64> = params.iter().map(|&x| x as f64).collect();
    let (w, u, bias, v, c) = (
        &p[..h],
        &p[h..h + h * h],
        &p[h + h * h..2 * h + h * h],
        &p[2 * h + h * h..3 * h + h * h],
        p[3 * h + h * h],
    );
    let scale = 1.0 / (cfg.batch as f64 * (t_len - cfg.loss_from as usize) as f64);
    let mut grads = vec![0.0f64; p.len()];
    let mut loss = 0.0;
    for b in 0..cfg.batch {
        let x: Vec<f64> = (0..cfg.seq_len)
            .map(|t| input(cfg.seed, step, b, t) as f64)
            .collect();
        // hs[t + 1] = h_t, hs[0] = 0.
        let mut hs = vec![vec![0.0f64; h]; t_len + 1];
        let mut dy = vec![0.0f64; t_len];
        let mut sum = 0.0;
        for t in 0..t_len {
            for j in 0..h {
                let mut a = w[j] * x[t] + bias[j];
                for k in 0..h {
                    a += u[j * h + k] * hs[t][k];
                }
                hs[t + 1][j] = a.clamp(-15.0, 15.0).tanh();
            }
            let y = c + (0..h).map(|k| v[k] * hs[t + 1][k]).sum::<f64>();
            sum += x[t];
            let z = sum / ((t + 1) as f64).sqrt();
            if t >= cfg.loss_from as usize {
                loss += (y - z) * (y - z) * scale;
                dy[t] = 2.0 * (y - z) * scale;
            }
        }
        let mut dh = vec![0.0f64; h];
        for t in (0..t_len).rev() {
            let da: Vec<f64> = (0..h)
                .map(|j| {
                    dh[j] += v[j] * dy[t];
                    dh[j] * (1.0 - hs[t + 1][j] * hs[t + 1][j])
                })
                .collect();
            for j in 0..h {
                grads[j] += da[j] * x[t];
                for k in 0..h {
                    grads[h + j * h + k] += da[j] * hs[t][k];
                }
                grads[h + h * h + j] += da[j];
                grads[2 * h + h * h + j] += dy[t] * hs[t + 1][j];
            }
            grads[3 * h + h * h] += dy[t];
            for (k, dhk) in dh.iter_mut().enumerate() {
                *dhk = (0..h).map(|j| u[j * h + k] * da[j]).sum();
            }
        }
    }
    (loss, grads)
}
