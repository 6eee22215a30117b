//! Bounds-checked big-endian reading and writing. Every access goes through `get`/`get_mut`,
//! so nothing here can panic.

use crate::{Kind, Result, WireError};

/// Reads fields in order from a message body.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: Kind,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], kind: Kind) -> Self {
        Reader { buf, pos: 0, kind }
    }

    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8]> {
        let end = self.pos.saturating_add(n);
        let out = self.buf.get(self.pos..end).ok_or(WireError::BodyTooShort {
            kind: self.kind,
            field,
            need: end,
            have: self.buf.len(),
        })?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// A length-prefixed UTF-8 string whose length is `len` and must lie in `min..=max`.
    pub(crate) fn str(
        &mut self,
        len: usize,
        min: usize,
        max: usize,
        field: &'static str,
    ) -> Result<&'a str> {
        if len < min || len > max {
            return Err(WireError::BadLength {
                field,
                len,
                min,
                max,
            });
        }
        let bytes = self.take(len, field)?;
        core::str::from_utf8(bytes).map_err(|_| WireError::InvalidUtf8 { field })
    }

    /// Error if any byte is left.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.buf.len().saturating_sub(self.pos) {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { extra }),
        }
    }
}

/// Writes fields in order into an output buffer.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<()> {
        let end = self.pos.saturating_add(bytes.len());
        let have = self.buf.len();
        let dst = self
            .buf
            .get_mut(self.pos..end)
            .ok_or(WireError::BufferTooSmall { need: end, have })?;
        dst.copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    pub(crate) fn u8(&mut self, v: u8) -> Result<()> {
        self.put(&[v])
    }

    pub(crate) fn u16(&mut self, v: u16) -> Result<()> {
        self.put(&v.to_be_bytes())
    }

    pub(crate) fn u32(&mut self, v: u32) -> Result<()> {
        self.put(&v.to_be_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> Result<()> {
        self.put(&v.to_be_bytes())
    }
}

/// Read a big-endian integer at a fixed offset. Callers guarantee the range is in bounds
/// (checked views call it only after their length check).
#[inline]
pub(crate) fn get<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

/// Write bytes at a fixed offset. Same contract as [`get`].
#[inline]
pub(crate) fn set(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Fail with `BufferTooSmall` unless `buf` holds `need` bytes.
#[inline]
pub(crate) fn need(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(WireError::BufferTooSmall {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// `Err(TrailingBytes)` when a body of `have` bytes is longer than its fixed `len`.
pub(crate) fn exact(have: usize, len: usize) -> crate::Result<()> {
    match have.saturating_sub(len) {
        0 => Ok(()),
        extra => Err(crate::WireError::TrailingBytes { extra }),
    }
}
