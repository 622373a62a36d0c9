// The bf16 format of elem_packed16.wgsl. bf16 is the top half of an f32, so
// decoding is a shift (exact, subnormals and NaN payloads included) and
// encoding rounds the dropped 16 bits to nearest even on the integer bits
// (half.wgsl).

fn decode16(h: u32) -> u32 {
    return h << 16u;
}

fn encode16(x: f32) -> u32 {
    return f32_bits_to_bf16(bitcast<u32>(x));
}
