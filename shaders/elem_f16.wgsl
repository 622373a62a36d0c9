enable f16;

// Element access for f16 gradients through shader-f16 (native 16-bit loads
// and stores, one element per invocation step). The f16 -> f32 conversion
// is exact; for stores the value is first rounded to the f16 grid on the
// integer bits (half.wgsl), so that the f32 -> f16 conversion, whose
// rounding WGSL leaves to the implementation, only ever converts a value it
// represents exactly. This file must come first in its module: WGSL wants
// `enable` before any declaration.

@group(0) @binding(0) var<storage, read_write> grads: array<f16>;

const UNIT: u32 = 1u;

fn load_unit(j: u32) -> vec2<u32> {
    return vec2(bitcast<u32>(f32(grads[j])), 0u);
}

fn store_unit(j: u32, n: u32, v: vec2<f32>) {
    let exact = f16_to_f32_bits(f32_bits_to_f16(bitcast<u32>(v.x)));
    grads[j] = f16(bitcast<f32>(exact));
}
