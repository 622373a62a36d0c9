// Element access for f32 gradients whose window binding is a whole number
// of 16-byte quads (the host rounds a window up to one when its buffer has
// the bytes, and takes elem_f32_unaligned.wgsl where it has not): one vec4
// load or store per quad.
//
// Every element file defines the gradients binding and, for quad q
// (window elements 4q .. 4q + 3; a window starts on a storage offset
// alignment, so quads are 16-byte aligned in f32 and 8-byte aligned in
// 16-bit types whatever a tensor's offset):
//   load_quad(q)           the f32 bits of its four elements, decoded exactly;
//                          elements past the binding's end read as anything
//                          (the passes ignore elements outside their run);
//   load_element(i)        the f32 bits of window element i alone, as
//                          load_quad gives them (one load where a tiny
//                          tensor needs one element, not four);
//   store_quad(q, v)       writes all four, in the element type;
//   store_element(q, k, x) writes element k alone. Other invocations may be
//                          writing the quad's other elements at the same time
//                          (a quad can hold the ends of two runs), so this
//                          never writes memory of another run's element.
// 16-bit types are rounded to nearest even on the integer bits (half.wgsl).
// The reduce and scale passes are written once against these.

@group(0) @binding(0) var<storage, read_write> grads: array<vec4<f32>>;

fn load_element(i: u32) -> u32 {
    return bitcast<u32>(grads[i >> 2u][i & 3u]);
}

fn load_quad(q: u32) -> vec4<u32> {
    return bitcast<vec4<u32>>(grads[q]);
}

fn store_quad(q: u32, v: vec4<f32>) {
    grads[q] = v;
}

fn store_element(q: u32, k: u32, x: f32) {
    grads[q][k] = x;
}
