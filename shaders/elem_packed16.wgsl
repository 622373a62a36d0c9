// Element access for 16-bit gradients read and written as u32 words (f16
// without shader-f16 on WebGPU and GL; bf16 everywhere, WGSL has no bf16
// type): two elements per word, element 2w in the low half, a quad in two
// words; see elem_f32.wgsl for what an element file defines. The format
// file composed before this one (packed16_f16.wgsl, packed16_bf16.wgsl)
// defines decode16 (16 bits to f32 bits) and encode16 (f32 to 16 bits).
// Every 16-bit tensor starts at an even element (4-byte aligned), so a word
// never holds two tensors' elements: a store_element that rewrites one half
// of a word puts back the other half, which is its own run's or padding.

@group(0) @binding(0) var<storage, read_write> grads: array<u32>;

fn load_element(i: u32) -> u32 {
    return decode16((grads[i >> 1u] >> (16u * (i & 1u))) & 0xffffu);
}

fn load_quad(q: u32) -> vec4<u32> {
    let w0 = grads[2u * q];
    let w1 = grads[2u * q + 1u];
    return vec4(
        decode16(w0 & 0xffffu),
        decode16(w0 >> 16u),
        decode16(w1 & 0xffffu),
        decode16(w1 >> 16u),
    );
}

fn store_quad(q: u32, v: vec4<f32>) {
    grads[2u * q] = encode16(v.x) | (encode16(v.y) << 16u);
    grads[2u * q + 1u] = encode16(v.z) | (encode16(v.w) << 16u);
}

fn store_element(q: u32, k: u32, x: f32) {
    let w = 2u * q + k / 2u;
    let shift = 16u * (k % 2u);
    grads[w] = (grads[w] & ~(0xffffu << shift)) | (encode16(x) << shift);
}
