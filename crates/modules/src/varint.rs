//! LEB128 varints and zigzag, for compact pair headers. Decoders are bounds-checked and
//! reject overlong encodings; they never panic.

/// Appends `v` as an unsigned LEB128 varint (1..=10 bytes).
pub fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` zigzag-encoded as a varint.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads an unsigned varint from the front of `buf`, returning it and the bytes used.
/// `None` when `buf` ends inside the varint or the value does not fit in 64 bits.
pub fn get_u64(buf: &[u8]) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(10) {
        let part = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return None; // more than 64 bits
        }
        v |= part << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Decodes a zigzag-encoded value.
pub fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// Reads a zigzag varint.
#[cfg(test)]
pub fn get_i64(buf: &[u8]) -> Option<(i64, usize)> {
    get_u64(buf).map(|(u, n)| (unzigzag(u), n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        let mut v = Vec::new();
        put_u64(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        v.clear();
        put_i64(&mut v, -1);
        assert_eq!(v, [0x01]);
        v.clear();
        put_u64(&mut v, u64::MAX);
        assert_eq!(v.len(), 10);
        assert_eq!(get_u64(&v), Some((u64::MAX, 10)));
    }

    #[test]
    fn truncated_and_overlong_are_rejected() {
        assert_eq!(get_u64(&[0x80]), None);
        assert_eq!(get_u64(&[]), None);
        assert_eq!(get_u64(&[0xff; 10]), None);
        assert_eq!(
            get_u64(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            None
        );
    }

    proptest! {
        #[test]
        fn round_trip(u in any::<u64>(), i in any::<i64>()) {
            let mut v = Vec::new();
            put_u64(&mut v, u);
            put_i64(&mut v, i);
            let (a, n) = get_u64(&v).unwrap();
            let (b, m) = get_i64(&v[n..]).unwrap();
            prop_assert_eq!((a, b, n + m), (u, i, v.len()));
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = get_u64(&bytes);
            let _ = get_i64(&bytes);
        }
    }
}
