//! A simulated six-axis 3D mouse (a SpaceNavigator), the dissertation's 62.5 Hz input device.
//!
//! Each frame carries one 14-byte [`Record`]:
//!
//! | bytes | field | type |
//! |---|---|---|
//! | 0–1 | `tx` translation x | i16 big-endian |
//! | 2–3 | `ty` translation y | i16 big-endian |
//! | 4–5 | `tz` translation z | i16 big-endian |
//! | 6–7 | `rx` rotation x | i16 big-endian |
//! | 8–9 | `ry` rotation y | i16 big-endian |
//! | 10–11 | `rz` rotation z | i16 big-endian |
//! | 12–13 | button mask, bit 0 = button 0 | u16 big-endian |
//!
//! Axes stay within ±[`AXIS_RANGE`]. The motion is smooth and seeded ([`Motion`]): each axis is
//! a sum of two sines with seeded amplitudes, frequencies and phases plus a little noise, and
//! button 0 is held now and then. Record `seq` is a pure function of `(seed, rate_hz, seq)`.

use super::record::{SplitMix64, GOLDEN};
use std::f64::consts::TAU;

/// Size of an encoded [`Record`].
pub const RECORD_LEN: usize = 14;
/// Axis values lie in `-AXIS_RANGE..=AXIS_RANGE`.
pub const AXIS_RANGE: i16 = 350;

/// One report of the 3D mouse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Record {
    /// `tx, ty, tz, rx, ry, rz`.
    pub axes: [i16; 6],
    /// Pressed buttons, bit `n` = button `n`.
    pub buttons: u16,
}

/// A byte string that is not a [`Record`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spacenav record: expected {RECORD_LEN} bytes, got {len}")]
pub struct DecodeError {
    /// Length received.
    pub len: usize,
}

impl Record {
    /// The 14-byte wire form (see the module docs).
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0; RECORD_LEN];
        for (i, a) in self.axes.iter().enumerate() {
            out[2 * i..2 * i + 2].copy_from_slice(&a.to_be_bytes());
        }
        out[12..14].copy_from_slice(&self.buttons.to_be_bytes());
        out
    }

    /// Parses the wire form; any length other than 14 is an error.
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        let b: &[u8; RECORD_LEN] = bytes
            .try_into()
            .map_err(|_| DecodeError { len: bytes.len() })?;
        let mut axes = [0i16; 6];
        for (i, a) in axes.iter_mut().enumerate() {
            *a = i16::from_be_bytes([b[2 * i], b[2 * i + 1]]);
        }
        Ok(Record {
            axes,
            buttons: u16::from_be_bytes([b[12], b[13]]),
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Wave {
    amp: f64,
    hz: f64,
    phase: f64,
}

/// The seeded motion of the simulated device.
#[derive(Debug, Clone)]
pub struct Motion {
    seed: u64,
    rate_hz: f64,
    waves: [[Wave; 2]; 6],
}

/// Largest noise added to an axis.
const NOISE: f64 = 6.0;

impl Motion {
    /// The motion for `seed`, sampled at `rate_hz` (a non-positive or non-finite rate is
    /// treated as 62.5 Hz).
    pub fn new(seed: u64, rate_hz: f64) -> Motion {
        let rate_hz = if rate_hz.is_finite() && rate_hz > 0.0 {
            rate_hz
        } else {
            62.5
        };
        let mut g = SplitMix64::new(seed);
        let mut wave = |amp: (f64, f64), hz: (f64, f64)| Wave {
            amp: amp.0 + (amp.1 - amp.0) * g.next_f64(),
            hz: hz.0 + (hz.1 - hz.0) * g.next_f64(),
            phase: TAU * g.next_f64(),
        };
        let mut waves = [[Wave {
            amp: 0.0,
            hz: 0.0,
            phase: 0.0,
        }; 2]; 6];
        for w in &mut waves {
            // A slow sweep and a faster wobble: at most 220 + 100 + NOISE < AXIS_RANGE.
            w[0] = wave((120.0, 220.0), (0.1, 0.5));
            w[1] = wave((40.0, 100.0), (0.5, 2.0));
        }
        Motion {
            seed,
            rate_hz,
            waves,
        }
    }

    /// The record of frame `seq` (at time `seq / rate_hz`).
    pub fn record(&self, seq: u64) -> Record {
        let t = seq as f64 / self.rate_hz;
        let mut noise = SplitMix64::new(self.seed ^ seq.wrapping_mul(GOLDEN) ^ 0x5bac_e5a7);
        let mut axes = [0i16; 6];
        for (a, w) in axes.iter_mut().zip(&self.waves) {
            let v: f64 = w
                .iter()
                .map(|w| w.amp * (TAU * w.hz * t + w.phase).sin())
                .sum::<f64>()
                + NOISE * (2.0 * noise.next_f64() - 1.0);
            let r = f64::from(AXIS_RANGE);
            *a = v.round().clamp(-r, r) as i16;
        }
        // Button 0: in about one second out of three, held for the first quarter second.
        let block_len = (self.rate_hz.round() as u64).max(1);
        let block = seq / block_len;
        let held = (seq % block_len) < (block_len / 4).max(1);
        let pressed = SplitMix64::new(self.seed ^ block.wrapping_mul(GOLDEN) ^ 0xb077_0500)
            .next()
            .is_multiple_of(3);
        Record {
            axes,
            buttons: u16::from(pressed && held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_layout_is_big_endian_axes_then_buttons() {
        let r = Record {
            axes: [1, -1, 350, -350, 0x0102, 0],
            buttons: 0x8001,
        };
        assert_eq!(
            r.encode(),
            [0, 1, 0xff, 0xff, 0x01, 0x5e, 0xfe, 0xa2, 0x01, 0x02, 0, 0, 0x80, 0x01]
        );
        assert_eq!(Record::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn decode_of_wrong_length_is_an_error() {
        assert_eq!(Record::decode(&[0; 13]), Err(DecodeError { len: 13 }));
        assert_eq!(Record::decode(&[0; 15]), Err(DecodeError { len: 15 }));
        assert_eq!(
            Record::decode(&[]).unwrap_err().to_string(),
            "spacenav record: expected 14 bytes, got 0"
        );
    }

    #[test]
    fn motion_is_in_range_smooth_deterministic_and_presses_button() {
        let m = Motion::new(1, 62.5);
        let recs: Vec<Record> = (0..2000).map(|s| m.record(s)).collect();
        assert_eq!(recs, (0..2000).map(|s| m.record(s)).collect::<Vec<_>>());
        for pair in recs.windows(2) {
            for i in 0..6 {
                let (a, b) = (pair[0].axes[i], pair[1].axes[i]);
                assert!((-350..=350).contains(&a));
                // At 62.5 Hz an axis moves at most about 2π(220·0.5 + 100·2)/62.5 + 2·noise.
                assert!((i32::from(a) - i32::from(b)).abs() < 50, "{a} -> {b}");
            }
        }
        let pressed = recs.iter().filter(|r| r.buttons & 1 == 1).count();
        assert!(pressed > 0 && pressed < recs.len() / 4, "{pressed}");
        assert!(recs.iter().all(|r| r.buttons & !1 == 0));
        let moving = recs.iter().map(|r| r.axes[0]).max() > recs.iter().map(|r| r.axes[0]).min();
        assert!(moving);
        assert_ne!(Motion::new(2, 62.5).record(10), m.record(10));
    }

    #[test]
    fn motion_survives_odd_rates() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-9, 1e9] {
            let r = Motion::new(3, rate).record(u64::MAX);
            assert!(r.axes.iter().all(|a| (-350..=350).contains(a)));
        }
    }
}
