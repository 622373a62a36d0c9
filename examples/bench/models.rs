//! Real models' parameter layouts, tensor by tensor in the order of their
//! `named_parameters()` (torchvision's ResNet-50, Hugging Face's GPT-2
//! small), built from the architectures' shapes: per-tensor clipping costs
//! what a layout's mix of long and short tensors makes it cost, and even
//! splits have no short tensors beside long ones.

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Model {
    /// ResNet-50 (torchvision): 161 tensors, 25 557 032 elements; its
    /// batch norms' weights and biases (64 to 2048 elements) lie between
    /// convolutions of up to 2.4 million.
    Resnet50,
    /// GPT-2 small (124 439 808 elements, 148 tensors): embeddings of 38.6
    /// million, layer norms and biases of 768 to 3072.
    Gpt2Small,
}

impl Model {
    /// Each parameter tensor's element count, in the model's order; an
    /// error unless they add up to the published parameter count
    /// (torchvision's weights table; GPT-2 small's 124M) in the tensor
    /// count of the model's `named_parameters()`.
    pub fn sizes(self) -> Result<Vec<usize>, String> {
        let (sizes, elements, tensors) = match self {
            Model::Resnet50 => (resnet50(), 25_557_032, 161),
            Model::Gpt2Small => (gpt2_small(), 124_439_808, 148),
        };
        let sum: usize = sizes.iter().sum();
        if sum != elements || sizes.len() != tensors {
            return Err(format!(
                "{self:?}: {} tensors of {sum} elements, not {tensors} of {elements}",
                sizes.len()
            ));
        }
        Ok(sizes)
    }
}

/// torchvision's resnet50: a 7x7 stem, four stages of 3, 4, 6 and 3
/// bottleneck blocks (1x1, 3x3, 1x1 convolutions, each with a batch norm's
/// weight and bias; the first block of a stage also a 1x1 downsample and
/// its batch norm), and the 1000-class linear layer.
fn resnet50() -> Vec<usize> {
    let mut sizes = vec![64 * 3 * 7 * 7, 64, 64];
    let mut inputs = 64;
    for (blocks, width) in [(3, 64), (4, 128), (6, 256), (3, 512)] {
        for block in 0..blocks {
            let out = 4 * width;
            sizes.extend([width * inputs, width, width]);
            sizes.extend([width * width * 9, width, width]);
            sizes.extend([out * width, out, out]);
            if block == 0 {
                sizes.extend([out * inputs, out, out]);
            }
            inputs = out;
        }
    }
    sizes.extend([1000 * 2048, 1000]);
    sizes
}

/// GPT-2 small: token and position embeddings, 12 blocks of layer norm,
/// attention (qkv and output projections with biases), layer norm and MLP
/// (768 -> 3072 -> 768 with biases), and the final layer norm.
fn gpt2_small() -> Vec<usize> {
    let d = 768;
    let mut sizes = vec![50257 * d, 1024 * d];
    for _ in 0..12 {
        sizes.extend([d, d, d * 3 * d, 3 * d, d * d, d]);
        sizes.extend([d, d, d * 4 * d, 4 * d, 4 * d * d, d]);
    }
    sizes.extend([d, d]);
    sizes
}
