//! The RFB initialisation phase: ProtocolVersion, security, ClientInit, ServerInit.
//!
//! The decoders here are pure; [`crate::accel`] drives them over sockets. The proxy forwards every
//! byte of the handshake unchanged except that, for 3.7 and 3.8, the server's list of security
//! types is filtered to the ones it can pass through untouched (None and VNC authentication): the
//! proxy never sees a password, only the challenge and the response, which it relays.

use crate::ParseError;

/// Security types the accelerator can pass through.
pub const SEC_NONE: u8 = 1;
pub const SEC_VNC_AUTH: u8 = 2;

/// Negotiated protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V3_3,
    V3_7,
    V3_8,
}

impl Version {
    pub fn as_bytes(&self) -> &'static [u8; 12] {
        match self {
            Version::V3_3 => b"RFB 003.003\n",
            Version::V3_7 => b"RFB 003.007\n",
            Version::V3_8 => b"RFB 003.008\n",
        }
    }
}

/// Parse a 12-byte ProtocolVersion. Minor versions other than 7 and 8 (3.5 from old clients,
/// 3.889 from Apple) are treated as 3.3 or 3.8, as the RFB spec advises.
pub fn parse_version(b: &[u8]) -> Result<Version, ParseError> {
    if b.len() < 12 {
        return Err(ParseError::Truncated);
    }
    let ok = &b[0..4] == b"RFB "
        && b[7] == b'.'
        && b[11] == b'\n'
        && b[4..7].iter().chain(&b[8..11]).all(u8::is_ascii_digit);
    if !ok {
        return Err(ParseError::BadVersion);
    }
    let num = |s: &[u8]| s.iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0'));
    let (major, minor) = (num(&b[4..7]), num(&b[8..11]));
    if major != 3 {
        return Err(ParseError::BadVersion);
    }
    Ok(match minor {
        7 => Version::V3_7,
        m if m >= 8 => Version::V3_8,
        _ => Version::V3_3,
    })
}

/// Keep only the security types the proxy can pass through, in the server's order.
pub fn filter_security_types(types: &[u8]) -> Vec<u8> {
    types
        .iter()
        .copied()
        .filter(|t| *t == SEC_NONE || *t == SEC_VNC_AUTH)
        .collect()
}

/// Fixed part of ServerInit: width, height, pixel format, name length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInit {
    pub width: u16,
    pub height: u16,
    pub pixel_format: crate::PixelFormat,
    pub name_len: u32,
}

impl ServerInit {
    pub const FIXED_LEN: usize = 24;

    pub fn parse(b: &[u8]) -> Result<ServerInit, ParseError> {
        if b.len() < Self::FIXED_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(ServerInit {
            width: u16::from_be_bytes([b[0], b[1]]),
            height: u16::from_be_bytes([b[2], b[3]]),
            pixel_format: crate::PixelFormat::parse(&b[4..20])?,
            name_len: u32::from_be_bytes([b[20], b[21], b[22], b[23]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_versions() {
        assert_eq!(parse_version(b"RFB 003.003\n"), Ok(Version::V3_3));
        assert_eq!(parse_version(b"RFB 003.005\n"), Ok(Version::V3_3));
        assert_eq!(parse_version(b"RFB 003.007\n"), Ok(Version::V3_7));
        assert_eq!(parse_version(b"RFB 003.008\n"), Ok(Version::V3_8));
        assert_eq!(parse_version(b"RFB 003.889\n"), Ok(Version::V3_8));
        assert_eq!(parse_version(b"RFB 004.000\n"), Err(ParseError::BadVersion));
        assert_eq!(parse_version(b"HTTP/1.1 200"), Err(ParseError::BadVersion));
        assert_eq!(parse_version(b"RFB 003.00"), Err(ParseError::Truncated));
    }

    #[test]
    fn filter_types() {
        assert_eq!(filter_security_types(&[19, 2, 1, 16]), vec![2, 1]);
        assert!(filter_security_types(&[19, 18]).is_empty());
    }

    #[test]
    fn parse_server_init() {
        let mut b = vec![0x02, 0x80, 0x01, 0xe0];
        b.extend_from_slice(&crate::PixelFormat::default().emit());
        b.extend_from_slice(&[0, 0, 0, 3]);
        let si = ServerInit::parse(&b).unwrap();
        assert_eq!((si.width, si.height, si.name_len), (640, 480, 3));
        b[4] = 24;
        assert_eq!(ServerInit::parse(&b), Err(ParseError::BadPixelFormat(24)));
        assert_eq!(ServerInit::parse(&b[..10]), Err(ParseError::Truncated));
    }
}
