// Element access for bf16 gradients (WGSL has no bf16 type): two elements
// per u32 word, element 2w in the low half; the same word ownership rule as
// elem_f16_packed.wgsl. bf16 is the top half of an f32, so decoding is a
// shift (exact, subnormals and NaN payloads included) and encoding rounds
// the dropped 16 bits to nearest even on the integer bits (half.wgsl).

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;

const UNIT: u32 = 2u;

fn load_unit(j: u32) -> vec2<u32> {
    let w = grads[j >> 1u];
    return vec2(w << 16u, w & 0xffff0000u);
}

fn store_unit(j: u32, n: u32, v: vec2<f32>) {
    let lo = f32_bits_to_bf16(bitcast<u32>(v.x));
    var hi = grads[j >> 1u] & 0xffff0000u;
    if n == 2u {
        hi = f32_bits_to_bf16(bitcast<u32>(v.y)) << 16u;
    }
    grads[j >> 1u] = hi | lo;
}
