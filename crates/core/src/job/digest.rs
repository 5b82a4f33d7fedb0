//! Deterministic ids: hashes of inputs, never of the clock or a random source.


/// The first 128 bits of BLAKE3 over the parts (each length-prefixed, so no
/// two different part lists hash alike), as 32 hex digits.
pub fn hash_hex(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().to_hex()[..32].to_owned()
}
