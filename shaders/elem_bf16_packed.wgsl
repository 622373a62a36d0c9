// Element access for bf16 gradients (WGSL has no bf16 type): two elements
// per u32 word, element 2w in the low half, a quad in two words; the same
// word ownership rule as elem_f16_packed.wgsl. bf16 is the top half of an
// f32, so decoding is a shift (exact, subnormals and NaN payloads included)
// and encoding rounds the dropped 16 bits to nearest even on the integer
// bits (half.wgsl).

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;

fn load_quad(q: u32) -> vec4<u32> {
    let w0 = grads[2u * q];
    let w1 = grads[2u * q + 1u];
    return vec4(w0 << 16u, w0 & 0xffff0000u, w1 << 16u, w1 & 0xffff0000u);
}

fn encode(x: f32) -> u32 {
    return f32_bits_to_bf16(bitcast<u32>(x));
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
