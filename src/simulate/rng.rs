//! Randomness: per-draw hashing, so a pod's n-th start takes the same time under every
//! action (a run is deterministic for its seed).

/// SplitMix64: tiny, deterministic, good enough for delays.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A uniform and a standard normal draw (Box-Muller) for one keyed event.
pub fn draws(seed: u64, key: u64) -> (f64, f64) {
    let a = mix(seed ^ mix(key));
    let b = mix(a);
    let u1 = unit(a).max(f64::MIN_POSITIVE);
    let u2 = unit(b);
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (unit(mix(b)), z)
}
