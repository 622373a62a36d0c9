// Element access for f32 gradients: one element per invocation step.
// Every element file defines the gradients binding and:
//   UNIT           elements one invocation handles per step (1, or 2 for every 16-bit path,
//                  so that native and packed f16 walk the elements alike);
//   load_unit(j)   f32 bits of elements j and j + 1 (window-relative), decoded exactly;
//                  .y is meaningful only when UNIT == 2 and j + 1 is inside the chunk;
//   store_unit(j, n, v)  writes the first n (1 or UNIT) of v back in the element type.
// The reduce and scale passes are written once against these.

@group(0) @binding(0) var<storage, read_write> grads: array<f32>;

const UNIT: u32 = 1u;

fn load_unit(j: u32) -> vec2<u32> {
    return vec2(bitcast<u32>(grads[j]), 0u);
}

fn store_unit(j: u32, n: u32, v: vec2<f32>) {
    grads[j] = v.x;
}
