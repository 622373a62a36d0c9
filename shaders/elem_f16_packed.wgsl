// Element access for f16 gradients without shader-f16 (WebGPU without the
// feature, GL): two elements per u32 word, element 2w in the low half.
// One invocation owns a whole word, and every tensor starts at an even
// element (4-byte aligned), so no two invocations ever write the same word;
// a tensor's odd tail word keeps its other half's bits as they were.

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;

const UNIT: u32 = 2u;

// j is even: chunks start on word boundaries.
fn load_unit(j: u32) -> vec2<u32> {
    let w = grads[j >> 1u];
    return vec2(f16_to_f32_bits(w & 0xffffu), f16_to_f32_bits(w >> 16u));
}

fn store_unit(j: u32, n: u32, v: vec2<f32>) {
    let lo = f32_bits_to_f16(bitcast<u32>(v.x));
    var hi = grads[j >> 1u] & 0xffff0000u;
    if n == 2u {
        hi = f32_bits_to_f16(bitcast<u32>(v.y)) << 16u;
    }
    grads[j >> 1u] = hi | lo;
}
