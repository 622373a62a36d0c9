enable f16;

// Element access for f16 gradients through shader-f16 (native 16-bit loads
// and stores); see elem_f32.wgsl for what an element file defines. Native
// and packed f16 walk the same quads in the same order and so give the same
// bits. The f16 -> f32 conversion is exact; for stores the value is first
// rounded to the f16 grid on the integer bits (half.wgsl), so that the
// f32 -> f16 conversion, whose rounding WGSL leaves to the implementation,
// only ever converts a value it represents exactly. This file must come
// first in its module: WGSL wants `enable` before any declaration.

@group(0) @binding(0) var<storage, read_write> grads: array<f16>;

fn load_element(i: u32) -> u32 {
    return bitcast<u32>(f32(grads[i]));
}

fn load_quad(q: u32) -> vec4<u32> {
    let i = 4u * q;
    return bitcast<vec4<u32>>(vec4(f32(grads[i]), f32(grads[i + 1u]), f32(grads[i + 2u]), f32(grads[i + 3u])));
}

fn store_element(q: u32, k: u32, x: f32) {
    let exact = f16_to_f32_bits(f32_bits_to_f16(bitcast<u32>(x)));
    grads[4u * q + k] = f16(bitcast<f32>(exact));
}

fn store_quad(q: u32, v: vec4<f32>) {
    store_element(q, 0u, v.x);
    store_element(q, 1u, v.y);
    store_element(q, 2u, v.z);
    store_element(q, 3u, v.w);
}
