// Element access for f16 gradients without shader-f16 (WebGPU without the
// feature, GL): two elements per u32 word, element 2w in the low half, a
// quad in two words; see elem_f32.wgsl for what an element file defines.
// Every 16-bit tensor starts at an even element (4-byte aligned), so a word
// never holds two tensors' elements: a store_element that rewrites one half
// of a word puts back the other half, which is its own run's or padding.

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;

fn load_quad(q: u32) -> vec4<u32> {
    let w0 = grads[2u * q];
    let w1 = grads[2u * q + 1u];
    return vec4(
        f16_to_f32_bits(w0 & 0xffffu),
        f16_to_f32_bits(w0 >> 16u),
        f16_to_f32_bits(w1 & 0xffffu),
        f16_to_f32_bits(w1 >> 16u),
    );
}

fn encode(x: f32) -> u32 {
    return f32_bits_to_f16(bitcast<u32>(x));
}

fn store_quad(q: u32, v: vec4<f32>) {
    grads[2u * q] = encode(v.x) | (encode(v.y) << 16u);
    grads[2u * q + 1u] = encode(v.z) | (encode(v.w) << 16u);
}

fn store_element(q: u32, k: u32, x: f32) {
    let w = 2u * q + k / 2u;
    let shift = 16u * (k % 2u);
    grads[w] = (grads[w] & ~(0xffffu << shift)) | (encode(x) << shift);
}
