enable f16;

// Element access for f16 gradients through shader-f16 (native 16-bit loads
// and stores). An invocation step takes two elements, as the packed path's
// word does, so that both paths walk and sum the elements in the same order
// and give the same bits; a tensor's odd tail has its second element in the
// binding (windows end on 4-byte words), and the passes ignore it. The f16 -> f32 conversion
// is exact; for stores the value is first rounded to the f16 grid on the
// integer bits (half.wgsl), so that the f32 -> f16 conversion, whose
// rounding WGSL leaves to the implementation, only ever converts a value it
// represents exactly. This file must come first in its module: WGSL wants
// `enable` before any declaration.

@group(0) @binding(0) var<storage, read_write> grads: array<f16>;

const UNIT: u32 = 2u;

fn load_unit(j: u32) -> vec2<u32> {
    return vec2(bitcast<u32>(f32(grads[j])), bitcast<u32>(f32(grads[j + 1u])));
}

fn store_f16(j: u32, x: f32) {
    let exact = f16_to_f32_bits(f32_bits_to_f16(bitcast<u32>(x)));
    grads[j] = f16(bitcast<f32>(exact));
}

fn store_unit(j: u32, n: u32, v: vec2<f32>) {
    store_f16(j, v.x);
    if n == 2u {
        store_f16(j + 1u, v.y);
    }
}
