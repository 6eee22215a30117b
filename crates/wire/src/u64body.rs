//! One macro for the message bodies that are exactly one big-endian u64 (ACK, END, PING,
//! RESUME): each kind's module keeps its own names, docs and tests, and the checked view,
//! the `Repr` and the length rules are written once.

/// `u64_body!(Kind, "NAME", field, set_field, FIELD_CONST, "field doc", "repr doc")`
/// defines `BODY_LEN`, `field::FIELD_CONST`, `Packet<T>` (checked view with getter and setter)
/// and `Repr { field }` with `parse`, `buffer_len` and `emit`.
macro_rules! u64_body {
    ($kind:expr, $name:literal, $get:ident, $set:ident, $konst:ident, $fdoc:literal) => {
        use crate::cursor::{get, need, set};
        use crate::{Kind, Result, WireError};

        #[doc = concat!("Length of a ", $name, " body.")]
        pub const BODY_LEN: usize = 8;

        #[doc = concat!("Byte ranges of the ", $name, " body fields.")]
        pub mod field {
            use core::ops::Range;
            #[doc = $fdoc]
            pub const $konst: Range<usize> = 0..8;
        }

        #[doc = concat!("Checked view of a ", $name, " body. After [`Packet::new_checked`] no getter panics.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wrap a body without checking its length.
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            #[doc = concat!("Wrap a body, checking it holds `", stringify!($get), "`.")]
            pub fn new_checked(buffer: T) -> Result<Packet<T>> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            #[doc = concat!("`Err(BodyTooShort)` unless the body holds `", stringify!($get), "`. Extra bytes are rejected by [`Repr::parse`], not here.")]
            pub fn check_len(&self) -> Result<()> {
                let have = self.buffer.as_ref().len();
                if have < BODY_LEN {
                    return Err(WireError::BodyTooShort {
                        kind: $kind,
                        field: stringify!($get),
                        need: BODY_LEN,
                        have,
                    });
                }
                Ok(())
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            #[doc = $fdoc]
            #[inline]
            pub fn $get(&self) -> u64 {
                u64::from_be_bytes(get(self.buffer.as_ref(), field::$konst.start))
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            #[doc = concat!("Set `", stringify!($get), "`.")]
            #[inline]
            pub fn $set(&mut self, value: u64) {
                set(self.buffer.as_mut(), field::$konst.start, &value.to_be_bytes());
            }
        }

        #[doc = concat!("A ", $name, " body as plain values.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct Repr {
            #[doc = $fdoc]
            pub $get: u64,
        }

        impl Repr {
            #[doc = concat!("Parse a ", $name, " body; extra bytes give `TrailingBytes`.")]
            pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
                packet.check_len()?;
                crate::cursor::exact(packet.buffer.as_ref().len(), BODY_LEN)?;
                Ok(Repr { $get: packet.$get() })
            }

            /// Body length: 8.
            pub const fn buffer_len(&self) -> usize {
                BODY_LEN
            }

            /// Write the body into the first 8 bytes of `packet`.
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
                need(packet.buffer.as_ref(), BODY_LEN)?;
                packet.$set(self.$get);
                Ok(())
            }
        }
    };
}
