//! Pieces the NATS fan-out simulations share (`tests/nats_*.rs`: `mod common;`).

use ndd_core::{Frame, ModuleError, Output};
use ndd_link::nats::keys::{Outcome, RunHalf};
use ndd_link::nats::send::RunSeal;
use ndd_modules::encrypt::key::Key;
use ndd_modules::encrypt::{Cipher, EncryptForward, EncryptInverse, Opening};
use std::sync::Arc;
use std::time::Instant;

/// The `encrypt` inverse as one run's receiving half of an
/// [`ndd_link::nats::keys::Opener`], as the binary's `RunInverse` (a window of 1024 frames,
/// 16 live sending epochs).
pub struct RunInverse(EncryptInverse);

impl RunHalf for RunInverse {
    fn under(key: [u8; 32]) -> RunInverse {
        RunInverse(
            EncryptInverse::new(Arc::new(Key::given(key)), Cipher::Aes256Gcm, 1024)
                .without_auth_warnings()
                .with_live_epochs(16),
        )
    }

    fn open(
        &mut self,
        now: Instant,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<Outcome, ModuleError> {
        Ok(match self.0.open_bound(now, frame, wseq, out)? {
            Opening::Opened => Outcome::Opened,
            Opening::Replayed => Outcome::Replayed,
            Opening::Rejected => Outcome::Rejected,
        })
    }
}

/// The `encrypt` forward half as one run's sealing half of an
/// [`ndd_link::nats::send::Sender`], as the binary's `RunSealer`.
#[allow(dead_code)]
pub struct RunSealer(EncryptForward);

impl RunSeal for RunSealer {
    fn under(key: [u8; 32]) -> Result<RunSealer, ModuleError> {
        EncryptForward::new(&Key::given(key), Cipher::Aes256Gcm).map(RunSealer)
    }

    fn seal(&mut self, frame: Frame, wseq: u64, out: &mut Output) -> Result<(), ModuleError> {
        self.0.seal_bound(frame, wseq, out)
    }
}

thread_local! {
    /// The device side's identity (it signs rekey notices and run marks, as fanout does) and a
    /// stranger's (the adversary's forged ones), one pair per test thread.
    #[allow(dead_code)]
    pub static IDS: (ndd_link::seal::LocalIdentity, ndd_link::seal::LocalIdentity) = {
        let make = |name: &str| {
            let d = std::env::temp_dir().join(format!(
                "ndd-nats-sim-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("temp dir");
            let (id, _) = ndd_link::Identity::load_or_create(&d).expect("identity");
            let local = ndd_link::seal::LocalIdentity::new(&id).expect("local identity");
            let _ = std::fs::remove_dir_all(&d);
            local
        };
        (make("device"), make("stranger"))
    };
}
