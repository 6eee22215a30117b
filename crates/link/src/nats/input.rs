//! Where a fan-out sink's records come from (sans-IO): core NATS or a JetStream consumer,
//! which subject, which consumer, shared or not, resumed or not, and what it keeps for the
//! next process, as the stream's shape, the side and the server decide. The driver's
//! `drive/sink.rs` does what [`SinkInput`] says; before, it decided this in its own
//! branches, where no test reached them.
//!
//! - **A device side** reads every app side's frames on the stream's up subject; a reliable
//!   stream (with JetStream) through its own durable consumer, resumed where it stood, never
//!   shared, not ordered by subject sequence (many app sides publish there), and keeping the
//!   windows of what it opened for the next process (copies of frames taken already are
//!   dropped after a restart).
//! - **An app side** reads the stream's down subject of its split slot, if the stream splits
//!   (a slot below the parts, or no stream: the device gave it none); round-robin members
//!   read through the stream's queue group (core NATS) or its shared consumer (JetStream),
//!   in no order; others through a consumer of their own, ordered by subject sequence and
//!   keeping where they stood for the next process, resumed unless the stream is a picture
//!   in broadcast (`now_only`: it starts at what is stored after it joined).

use super::subjects::Subjects;

/// A fan-out stream as a sink sees it (from the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkShape {
    /// The stream's id.
    pub id: u16,
    /// Reliable (through JetStream when the server has it).
    pub reliable: bool,
    /// Split in this many parts among app sides.
    pub split: Option<u16>,
    /// Round-robin among app sides.
    pub round_robin: bool,
    /// A picture in broadcast: a returning app side starts at the screen now.
    pub now_only: bool,
}

/// Who reads: the device side, or an app side (its short id, its split slot if it has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader<'a> {
    /// The device side.
    Device,
    /// An app side.
    App {
        /// Its short id.
        me: &'a str,
        /// The split slot the device gave it.
        slot: Option<u16>,
    },
}

/// Where a sink's records come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkInput {
    /// Core NATS: `subject`, in queue group `queue` if round-robin.
    Core {
        /// The subject.
        subject: String,
        /// The round-robin queue group.
        queue: Option<String>,
    },
    /// A durable JetStream consumer `durable` on `filter`.
    Stored {
        /// The consumer's name.
        durable: String,
        /// Its subject filter.
        filter: String,
        /// Shared with the other round-robin members: never looked up nor deleted.
        shared: bool,
        /// One this side left behind resumes where it stood.
        resume: bool,
        /// One publisher's subject sequence orders its records.
        ordered: bool,
        /// Where it stood is kept for the next process (an app side's own consumer).
        keeps_position: bool,
        /// What it opened is kept for the next process (the device side's).
        keeps_windows: bool,
    },
}

/// The JetStream consumer an app side (`me`) reads `shape` through: the round-robin group's
/// shared one, or its own (of split slot `part`).
pub fn app_consumer(subjects: &Subjects, shape: &SinkShape, me: &str, part: Option<u16>) -> String {
    if shape.round_robin {
        subjects.group(shape.id)
    } else {
        subjects.durable(me, shape.id, part)
    }
}

/// Where `reader`'s sink of `shape` reads (`stored`: the server has JetStream for the
/// driver). An error names a split stream for which the device gave this app side no slot
/// below its parts.
pub fn sink_input(
    subjects: &Subjects,
    shape: &SinkShape,
    reader: Reader<'_>,
    stored: bool,
) -> Result<SinkInput, String> {
    let stored = stored && shape.reliable;
    let (me, slot) = match reader {
        Reader::Device if stored => {
            return Ok(SinkInput::Stored {
                durable: subjects.device_durable(shape.id),
                filter: subjects.up_stored(shape.id),
                shared: false,
                resume: true,
                ordered: false,
                keeps_position: false,
                keeps_windows: true,
            })
        }
        Reader::Device => {
            return Ok(SinkInput::Core {
                subject: subjects.up(shape.id),
                queue: None,
            })
        }
        Reader::App { me, slot } => (me, slot),
    };
    let part = match shape.split {
        Some(parts) => match slot {
            Some(s) if s < parts => Some(s),
            _ => {
                return Err(format!(
                    "the device side split it in {parts} parts but gave this side no slot below {parts}"
                ))
            }
        },
        None => None,
    };
    if !stored {
        return Ok(SinkInput::Core {
            subject: subjects.down(shape.id, false, part),
            queue: shape.round_robin.then(|| subjects.group(shape.id)),
        });
    }
    Ok(SinkInput::Stored {
        durable: app_consumer(subjects, shape, me, part),
        filter: subjects.down(shape.id, true, part),
        shared: shape.round_robin,
        resume: !shape.now_only,
        ordered: !shape.round_robin,
        keeps_position: !shape.round_robin,
        keeps_windows: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SinkShape {
        SinkShape {
            id: 3,
            reliable: true,
            split: None,
            round_robin: false,
            now_only: false,
        }
    }

    fn subjects() -> Subjects {
        Subjects::new("ndd", "cam").unwrap()
    }

    #[test]
    fn a_device_side_reads_every_app_side_through_its_own_consumer() {
        let s = subjects();
        let got = sink_input(&s, &shape(), Reader::Device, true).unwrap();
        assert_eq!(
            got,
            SinkInput::Stored {
                durable: s.device_durable(3),
                filter: s.up_stored(3),
                shared: false,
                resume: true,
                ordered: false,
                keeps_position: false,
                keeps_windows: true,
            }
        );
        // Lossy, or no JetStream: the up subject itself.
        let core = SinkInput::Core {
            subject: s.up(3),
            queue: None,
        };
        assert_eq!(
            sink_input(&s, &shape(), Reader::Device, false).unwrap(),
            core
        );
        let lossy = SinkShape {
            reliable: false,
            ..shape()
        };
        assert_eq!(sink_input(&s, &lossy, Reader::Device, true).unwrap(), core);
    }

    #[test]
    fn an_app_side_reads_its_own_ordered_consumer_and_keeps_where_it_stood() {
        let s = subjects();
        let me = Reader::App {
            me: "abc",
            slot: None,
        };
        assert_eq!(
            sink_input(&s, &shape(), me, true).unwrap(),
            SinkInput::Stored {
                durable: s.durable("abc", 3, None),
                filter: s.down(3, true, None),
                shared: false,
                resume: true,
                ordered: true,
                keeps_position: true,
                keeps_windows: false,
            }
        );
        // A picture in broadcast: not resumed.
        let now = SinkShape {
            now_only: true,
            ..shape()
        };
        assert!(matches!(
            sink_input(&s, &now, me, true).unwrap(),
            SinkInput::Stored { resume: false, .. }
        ));
        assert_eq!(
            sink_input(&s, &shape(), me, false).unwrap(),
            SinkInput::Core {
                subject: s.down(3, false, None),
                queue: None
            }
        );
    }

    #[test]
    fn round_robin_members_share_the_group_in_no_order() {
        let s = subjects();
        let rr = SinkShape {
            round_robin: true,
            ..shape()
        };
        let me = Reader::App {
            me: "abc",
            slot: None,
        };
        assert_eq!(
            sink_input(&s, &rr, me, true).unwrap(),
            SinkInput::Stored {
                durable: s.group(3),
                filter: s.down(3, true, None),
                shared: true,
                resume: true,
                ordered: false,
                keeps_position: false,
                keeps_windows: false,
            }
        );
        assert_eq!(
            sink_input(&s, &rr, me, false).unwrap(),
            SinkInput::Core {
                subject: s.down(3, false, None),
                queue: Some(s.group(3)),
            }
        );
    }

    #[test]
    fn a_split_stream_reads_the_slot_given_and_no_other() {
        let s = subjects();
        let split = SinkShape {
            split: Some(2),
            ..shape()
        };
        let at = |slot| Reader::App { me: "abc", slot };
        assert_eq!(
            sink_input(&s, &split, at(Some(1)), true).unwrap(),
            SinkInput::Stored {
                durable: s.durable("abc", 3, Some(1)),
                filter: s.down(3, true, Some(1)),
                shared: false,
                resume: true,
                ordered: true,
                keeps_position: true,
                keeps_windows: false,
            }
        );
        for slot in [None, Some(2), Some(7)] {
            let e = sink_input(&s, &split, at(slot), true).unwrap_err();
            assert_eq!(
                e,
                "the device side split it in 2 parts but gave this side no slot below 2"
            );
        }
    }
}
