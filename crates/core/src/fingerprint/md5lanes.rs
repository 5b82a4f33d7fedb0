//! MD5 of many short messages at once, one message per SIMD lane.
//!
//! The portable fingerprint hashes every row's canonical text with MD5 (the
//! hash every engine has natively: PostgreSQL `md5()`, Spark `md5()`,
//! DuckDB `md5_number()`), and sums the first 64 bits of each digest. Rows
//! are short (one or two 64-byte blocks), and MD5 is a chain of dependent
//! 32-bit operations, so one message at a time leaves the core mostly idle.
//! Independent messages, though, can run side by side: the same MD5 steps
//! applied to 16 (AVX-512), 8 (AVX2) or 4 (SSE2) messages in the lanes of a
//! vector register, a "multi-buffer" MD5. Written as plain loops over lanes,
//! which the compiler turns into vector instructions for the target feature
//! chosen at run time; the result is bit-for-bit the MD5 of each message
//! (tested against the reference implementation).

/// The first 8 bytes of the MD5 digest of each message, read little-endian
/// (the low 64 bits of DuckDB's `md5_number`), into `out[i]`.
pub fn md5_lo64_many(messages: &[&[u8]], out: &mut [u64]) {
    assert_eq!(messages.len(), out.len(), "one output per message");
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            unsafe { many_avx512(messages, out) };
            return;
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { many_avx2(messages, out) };
            return;
        }
    }
    many::<4>(messages, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn many_avx512(messages: &[&[u8]], out: &mut [u64]) {
    many::<16>(messages, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn many_avx2(messages: &[&[u8]], out: &mut [u64]) {
    many::<8>(messages, out);
}

/// The 64 additive constants, `floor(abs(sin(i + 1)) * 2^32)`.
const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501, 0x698098d8, 0x8b44f7af,
    0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa,
    0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8,
    0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244, 0x432aff97,
    0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1, 0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1,
    0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

/// Left-rotation amounts, per round.
const S: [[u32; 4]; 4] = [[7, 12, 17, 22], [5, 9, 14, 20], [4, 11, 16, 23], [6, 10, 15, 21]];

/// How many 64-byte blocks a message of `len` bytes takes once padded
/// (a 0x80 byte, zeros, then the 8-byte bit length).
fn blocks(len: usize) -> usize {
    (len + 8) / 64 + 1
}

/// Block `b` of the padded `message`.
#[inline(always)]
fn padded_block(message: &[u8], b: usize, out: &mut [u8; 64]) {
    *out = [0; 64];
    let start = b * 64;
    if start < message.len() {
        let end = message.len().min(start + 64);
        out[..end - start].copy_from_slice(&message[start..end]);
    }
    let len = message.len();
    if len >= start && len < start + 64 {
        out[len - start] = 0x80;
    }
    if b + 1 == blocks(len) {
        out[56..].copy_from_slice(&((len as u64) * 8).to_le_bytes());
    }
}

#[inline(always)]
fn many<const L: usize>(messages: &[&[u8]], out: &mut [u64]) {
    // Lanes advance together, so a group costs its longest message: group
    // the messages by their number of blocks (rows near 55 bytes are one
    // block or two), in their order within each count.
    // (A counting sort over 1, 2, 3 and 4-or-more blocks.)
    let bucket = |m: &[u8]| blocks(m.len()).min(4) - 1;
    let mut starts = [0usize; 5];
    for m in messages {
        starts[bucket(m) + 1] += 1;
    }
    for b in 1..5 {
        starts[b] += starts[b - 1];
    }
    let mut order = vec![0u32; messages.len()];
    for (i, m) in messages.iter().enumerate() {
        let b = bucket(m);
        order[starts[b]] = i as u32;
        starts[b] += 1;
    }
    let empty: &[u8] = &[];
    for group in order.chunks(L) {
        let mut lanes = [empty; L];
        for (lane, &i) in lanes.iter_mut().zip(group) {
            *lane = messages[i as usize];
        }
        let lo = group_lo64::<L>(&lanes);
        for (&i, h) in group.iter().zip(lo) {
            out[i as usize] = h;
        }
    }
}

/// MD5 of `L` messages, lane `l` holding message `l`.
#[inline(always)]
fn group_lo64<const L: usize>(messages: &[&[u8]; L]) -> [u64; L] {
    let mut nblocks = [0usize; L];
    for l in 0..L {
        nblocks[l] = blocks(messages[l].len());
    }
    let most = nblocks.iter().copied().max().unwrap_or(1);
    let mut state = [[0x67452301u32; L], [0xefcdab89; L], [0x98badcfe; L], [0x10325476; L]];
    let mut block = [0u8; 64];
    for b in 0..most {
        // The block's 16 words, transposed: w[i][l] is word i of lane l.
        let mut w = [[0u32; L]; 16];
        for l in 0..L {
            if b < nblocks[l] {
                padded_block(messages[l], b, &mut block);
                for (i, word) in block.chunks_exact(4).enumerate() {
                    w[i][l] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                }
            }
        }
        let next = compress::<L>(&state, &w);
        for l in 0..L {
            if b < nblocks[l] {
                for (s, n) in state.iter_mut().zip(next.iter()) {
                    s[l] = n[l];
                }
            }
        }
    }
    let mut lo = [0u64; L];
    for l in 0..L {
        lo[l] = u64::from(state[0][l]) | (u64::from(state[1][l]) << 32);
    }
    lo
}

/// The round functions F, G, H, I of RFC 1321, lane by lane.
#[inline(always)]
fn round_f<const R: usize, const L: usize>(b: &[u32; L], c: &[u32; L], d: &[u32; L]) -> [u32; L] {
    let mut f = [0u32; L];
    for l in 0..L {
        f[l] = match R {
            0 => (b[l] & c[l]) | (!b[l] & d[l]),
            1 => (d[l] & b[l]) | (!d[l] & c[l]),
            2 => b[l] ^ c[l] ^ d[l],
            _ => c[l] ^ (b[l] | !d[l]),
        };
    }
    f
}

/// One of the 64 steps: `a = b + ((a + F(b, c, d) + K[I] + w[g]) <<< s)`,
/// with everything a constant of the step, so it compiles to straight-line
/// vector code.
#[inline(always)]
fn step<const I: usize, const L: usize>(a: &mut [u32; L], b: &[u32; L], c: &[u32; L], d: &[u32; L], w: &[[u32; L]; 16]) {
    const fn g(i: usize) -> usize {
        match i / 16 {
            0 => i,
            1 => (5 * i + 1) % 16,
            2 => (3 * i + 5) % 16,
            _ => (7 * i) % 16,
        }
    }
    let f = match I / 16 {
        0 => round_f::<0, L>(b, c, d),
        1 => round_f::<1, L>(b, c, d),
        2 => round_f::<2, L>(b, c, d),
        _ => round_f::<3, L>(b, c, d),
    };
    let m = &w[const { g(I) }];
    let s = const { S[I / 16][I % 4] };
    for l in 0..L {
        let sum = f[l].wrapping_add(a[l]).wrapping_add(K[I]).wrapping_add(m[l]);
        a[l] = b[l].wrapping_add(sum.rotate_left(s));
    }
}

/// One MD5 compression of a 64-byte block in every lane.
#[inline(always)]
fn compress<const L: usize>(state: &[[u32; L]; 4], w: &[[u32; L]; 16]) -> [[u32; L]; 4] {
    let [mut a, mut b, mut c, mut d] = *state;
    // Four steps rotate the roles of a, b, c, d once round.
    macro_rules! four {
        ($($i:literal)*) => {$(
            step::<{ 4 * $i }, L>(&mut a, &b, &c, &d, w);
            step::<{ 4 * $i + 1 }, L>(&mut d, &a, &b, &c, w);
            step::<{ 4 * $i + 2 }, L>(&mut c, &d, &a, &b, w);
            step::<{ 4 * $i + 3 }, L>(&mut b, &c, &d, &a, w);
        )*};
    }
    four!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    let mut next = *state;
    for l in 0..L {
        next[0][l] = next[0][l].wrapping_add(a[l]);
        next[1][l] = next[1][l].wrapping_add(b[l]);
        next[2][l] = next[2][l].wrapping_add(c[l]);
        next[3][l] = next[3][l].wrapping_add(d[l]);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::{Digest, Md5};

    fn reference(m: &[u8]) -> u64 {
        let d = Md5::digest(m);
        u64::from_le_bytes(d[..8].try_into().unwrap())
    }

    #[test]
    fn equals_the_reference_md5_for_every_length_and_lane_count() {
        // Lengths across the one/two/three-block edges (55, 56, 63, 64, 119, 120).
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let messages: Vec<&[u8]> = (0..200).map(|n| &data[n % 7..n % 7 + n]).collect();
        let expected: Vec<u64> = messages.iter().map(|m| reference(m)).collect();
        let mut got = vec![0; messages.len()];
        md5_lo64_many(&messages, &mut got);
        assert_eq!(got, expected);
        for lanes in [1usize, 3, 4, 8, 16] {
            let mut got = vec![0; messages.len()];
            match lanes {
                1 => many::<1>(&messages, &mut got),
                3 => many::<3>(&messages, &mut got),
                4 => many::<4>(&messages, &mut got),
                8 => many::<8>(&messages, &mut got),
                _ => many::<16>(&messages, &mut got),
            }
            assert_eq!(got, expected, "{lanes} lanes");
        }
    }

    #[test]
    fn known_digests() {
        // RFC 1321's test suite: md5("") = d41d8cd98f00b204e9800998ecf8427e.
        let mut out = [0u64; 2];
        md5_lo64_many(&[b"", b"abc"], &mut out);
        assert_eq!(out[0], u64::from_le_bytes([0xd4, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04]));
        // md5("abc") = 900150983cd24fb0d6963f7d28e17f72.
        assert_eq!(out[1], u64::from_le_bytes([0x90, 0x01, 0x50, 0x98, 0x3c, 0xd2, 0x4f, 0xb0]));
    }
}
