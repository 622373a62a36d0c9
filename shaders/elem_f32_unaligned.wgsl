// Element access for f32 gradients whose window binding does not end on a
// 16-byte boundary (a buffer whose size is not a multiple of 16, bound up
// to its end): four f32 loads and stores per quad. The same quads, walk and
// arithmetic as elem_f32.wgsl, so both give the same bits; see there for
// what an element file defines.

@group(0) @binding(0) var<storage, read_write> grads: array<f32>;

fn load_element(i: u32) -> u32 {
    return bitcast<u32>(grads[i]);
}

fn load_quad(q: u32) -> vec4<u32> {
    let i = 4u * q;
    return bitcast<vec4<u32>>(vec4(grads[i], grads[i + 1u], grads[i + 2u], grads[i + 3u]));
}

fn store_quad(q: u32, v: vec4<f32>) {
    let i = 4u * q;
    grads[i] = v.x;
    grads[i + 1u] = v.y;
    grads[i + 2u] = v.z;
    grads[i + 3u] = v.w;
}

fn store_element(q: u32, k: u32, x: f32) {
    grads[4u * q + k] = x;
}
