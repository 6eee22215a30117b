//! Sound threads at a sound server's priority. A capture that is not read for half a second,
//! or a playback that is not fed, is a gap nobody can mend later; on a busy machine an
//! ordinary thread waits that long (seen: 456 ms with two other loads on two cores). Sound
//! servers run theirs above ordinary programs (PulseAudio: `nice-level = -11`); ndd's
//! capture and playback threads ask for the same, and go on at the normal level when the
//! system does not allow it (it needs root, `CAP_SYS_NICE`, or an `RLIMIT_NICE` of at least
//! 31, e.g. `@audio - nice -11` in `/etc/security/limits.conf`).

use rustix::process::{getpriority_process, setpriority_process, Pid};

/// The nice level PulseAudio's threads take.
pub(crate) const SOUND_NICE: i32 = -11;

/// The calling thread at a raised priority until dropped (then back where it was: the
/// blocking pool's thread runs other work afterwards).
#[derive(Debug)]
pub(crate) struct Raised {
    tid: Pid,
    before: i32,
}

/// Raises the calling thread to nice level `nice`: `None` when it is there already or the
/// system does not allow it.
pub(crate) fn raise(nice: i32) -> Option<Raised> {
    let tid = rustix::thread::gettid();
    let before = getpriority_process(Some(tid)).ok()?;
    if before <= nice {
        return None;
    }
    setpriority_process(Some(tid), nice).ok()?;
    Some(Raised { tid, before })
}

impl Drop for Raised {
    fn drop(&mut self) {
        // Lowering a priority is always allowed.
        let _ = setpriority_process(Some(self.tid), self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_thread_goes_back_to_its_level_and_others_are_untouched() {
        let tid = rustix::thread::gettid();
        let before = getpriority_process(Some(tid)).unwrap();
        let other = std::thread::spawn(|| {
            let t = rustix::thread::gettid();
            (t, getpriority_process(Some(t)).unwrap())
        })
        .join()
        .unwrap();
        // Allowed here (root): raised, and only this thread. Not allowed (an ordinary
        // user): nothing changed.
        if let Some(r) = raise(SOUND_NICE) {
            assert_eq!(getpriority_process(Some(tid)).unwrap(), SOUND_NICE);
            let pid = rustix::process::getpid();
            if pid != tid {
                assert_eq!(getpriority_process(Some(pid)).unwrap(), before);
            }
            drop(r);
        }
        assert_eq!(getpriority_process(Some(tid)).unwrap(), before);
        assert_eq!(other.1, before);
    }
}
