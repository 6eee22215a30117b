//! The sliding replay window of one epoch (the bitmap scheme of RFC 6479).

/// Why a counter is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// This counter was already delivered.
    Seen,
    /// The counter is `window` or more below the highest one delivered.
    TooOld,
}

impl Replay {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Replay::Seen => "counter already seen",
            Replay::TooOld => "counter older than the replay window",
        }
    }
}

/// Remembers which of the last `size` counters (below and including the highest) were
/// delivered. A bitmap of `ceil(size / 64) + 1` words, indexed by `counter / 64` modulo its
/// length, so sliding forward clears whole words and never shifts.
#[derive(Debug, Clone)]
pub(crate) struct ReplayWindow {
    size: u64,
    top: Option<u64>,
    bits: Vec<u64>,
}

impl ReplayWindow {
    /// A window of `size` counters (`size` ≥ 1; validated by the config).
    pub(crate) fn new(size: u32) -> ReplayWindow {
        let size = u64::from(size.max(1));
        let words = size.div_ceil(64) as usize + 1;
        ReplayWindow {
            size,
            top: None,
            bits: vec![0; words],
        }
    }

    fn slot(&self, counter: u64) -> (usize, u64) {
        let n = self.bits.len() as u64;
        (((counter / 64) % n) as usize, 1u64 << (counter % 64))
    }

    /// Whether `counter` may be delivered (does not record it).
    pub(crate) fn check(&self, counter: u64) -> Result<(), Replay> {
        let Some(top) = self.top else {
            return Ok(());
        };
        if counter > top {
            return Ok(());
        }
        if top - counter >= self.size {
            return Err(Replay::TooOld);
        }
        let (word, bit) = self.slot(counter);
        match self.bits.get(word) {
            Some(w) if w & bit != 0 => Err(Replay::Seen),
            _ => Ok(()),
        }
    }

    /// Records `counter` as delivered (call only after [`ReplayWindow::check`] passed and the
    /// frame authenticated).
    pub(crate) fn mark(&mut self, counter: u64) {
        match self.top {
            Some(top) if counter <= top => {}
            Some(top) => {
                // Clear the words the window slides over: (top/64, counter/64] (none when the
                // counter is in the top's word).
                let (old, new) = (top / 64, counter / 64);
                let n = self.bits.len() as u64;
                if new - old >= n {
                    self.bits.fill(0);
                } else {
                    for w in old + 1..=new {
                        if let Some(x) = self.bits.get_mut((w % n) as usize) {
                            *x = 0;
                        }
                    }
                }
                self.top = Some(counter);
            }
            None => self.top = Some(counter),
        }
        let (word, bit) = self.slot(counter);
        if let Some(w) = self.bits.get_mut(word) {
            *w |= bit;
        }
    }
}
