//! Growing sequence numbers for pairs that emit frames of their own (a `periodic` repeat, an
//! `image` refinement): the session numbers DATA by a frame's seq and drops one that is not
//! above the last as a duplicate, so every frame a half emits must carry a larger seq than the
//! one before.

/// The seq emitted last.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RisingSeq(Option<u64>);

impl RisingSeq {
    /// The seq the next frame gets: its own, or last + 1 if its own is not above the last.
    pub(crate) fn take(&mut self, own: u64) -> u64 {
        let seq = match self.0 {
            Some(l) if own <= l => l.saturating_add(1),
            _ => own,
        };
        self.0 = Some(seq);
        seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqs_keep_their_own_value_or_go_one_above_the_last() {
        let mut s = RisingSeq::default();
        assert_eq!(s.take(5), 5);
        assert_eq!(s.take(5), 6, "a repeat goes above");
        assert_eq!(s.take(6), 7, "a fresh frame caught up is renumbered");
        assert_eq!(s.take(9), 9, "a fresh frame above keeps its own");
    }
}
