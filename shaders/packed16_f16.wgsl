// The f16 format of elem_packed16.wgsl (half.wgsl's conversions: exact
// decoding, subnormals included; encoding rounds to nearest even).

fn decode16(h: u32) -> u32 {
    return f16_to_f32_bits(h);
}

fn encode16(x: f32) -> u32 {
    return f32_bits_to_f16(bitcast<u32>(x));
}
