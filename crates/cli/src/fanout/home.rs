//! The device side's files in the ndd home: the group key, who holds it, the keys its last
//! rotations retired, and its runs.

use super::*;
use ndd_link::nats::rotate::{parse_retired, Retired};

/// Where the group key of `driver` lives in the ndd home.
pub(super) fn key_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.key"))
}

/// Who was handed the group key now in `key_path` (one fingerprint a line): if one of them
/// is no longer trusted, the key is rotated.
pub(super) fn holders_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.holders"))
}

/// The split slots held (`SLOT FINGERPRINT` a line): a restarted device side gives each app
/// side its slot back (`Admitter::restore`).
pub(super) fn slots_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-slots-{prefix}-{driver}"))
}

/// The slots the run before this one left, given back to `admitter`.
pub(super) fn restore_slots(path: &Path, admitter: &mut Admitter) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let (held, bad) = ndd_link::nats::admit::parse_slots(&text);
    if bad > 0 {
        tracing::warn!(
            side = "device",
            "{}: {bad} lines are not a slot and a fingerprint; left out",
            path.display()
        );
    }
    admitter.restore(Instant::now(), &held);
}

/// 32 fresh random bytes.
pub(super) fn draw_key() -> Result<[u8; 32]> {
    use ring::rand::SecureRandom;
    let mut k = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut k)
        .map_err(|_| anyhow!("the system random number generator failed"))?;
    Ok(k)
}

/// Replaces `path` with `bytes` atomically, readable by its owner only.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })()
    .with_context(|| format!("cannot write {}", path.display()))
}

/// Where the key before the last rotation of `driver` lives, with the JetStream sequence of
/// the rotation: `key (32) ‖ since (u64 BE)`, then the key before it the same way, then the
/// keys retired before those the same way, newest first, at most `RETIRED_KEYS` (since
/// 2026-11-30); mode 0600.
pub(super) fn previous_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.previous"))
}

/// The group key of `driver` and what its last rotation left (see [`GroupKey`]), for the
/// device run `run`.
pub(super) fn group_key(
    home: &Path,
    prefix: &str,
    driver: &str,
    run: Run,
    earlier: [Option<Run>; EARLIER_RUNS],
) -> Result<GroupKey> {
    let key = current_key(home, prefix, driver)?;
    let path = previous_path(home, prefix, driver);
    let keys = GroupKey {
        earlier,
        ..GroupKey::first(key, run)
    };
    let retired = match std::fs::read(&path).map(|b| parse_retired(&b)) {
        Ok(Ok(r)) => r,
        Ok(Err(len)) => {
            tracing::warn!(
                side = "device",
                "{} holds {len} bytes, not keys with their sequences (40 each); ignored: app → device frames sealed before the last rotation and not yet read will not open",
                path.display(),
            );
            Retired::default()
        }
        Err(_) => Retired::default(),
    };
    Ok(retired.under(keys))
}

/// Where the device side notes its last runs, oldest first: `id (u64 BE) ‖ began (u64 BE)`
/// each, at most [`EARLIER_RUNS`] + 1 (before 2026-11-29: the last id alone, 8 bytes). The
/// next run's id is higher (a recording of an earlier run never passes for a later one, see
/// [`next_run_id`]); the earlier runs go to the app sides in the keys (`GroupKey::earlier`).
pub(super) fn run_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.run"))
}

/// A device side's new run, beginning after JetStream stream sequence `began`, and its runs
/// before it (newest first); the run is noted in the home before any frame of it is sealed.
pub(super) fn new_run(
    home: &Path,
    prefix: &str,
    driver: &str,
    began: u64,
) -> Result<(Run, [Option<Run>; EARLIER_RUNS])> {
    let path = run_path(home, prefix, driver);
    let u64_at = |b: &[u8], at: usize| {
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(n)
    };
    let (last, mut runs): (Option<u64>, Vec<Run>) = match std::fs::read(&path) {
        Ok(b) if b.len() == 8 => (Some(u64_at(&b, 0)), Vec::new()),
        Ok(b) if !b.is_empty() && b.len() % 16 == 0 => {
            let runs: Vec<Run> = b
                .chunks_exact(16)
                .map(|c| Run {
                    id: u64_at(c, 0),
                    began: u64_at(c, 8),
                })
                .collect();
            (runs.last().map(|r| r.id), runs)
        }
        Ok(b) => {
            return Err(anyhow!(
                "{} holds {} bytes, not run ids (8, or 16 per run); delete it if no earlier run of this driver can be replayed into the next (app sides then refuse nothing of earlier runs that a clock set back would number higher)",
                path.display(),
                b.len()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    };
    let id = next_run_id(last, wall_ns(), random_u64() as u16);
    let run = Run { id, began };
    let mut earlier = [None; EARLIER_RUNS];
    for (e, r) in earlier.iter_mut().zip(runs.iter().rev()) {
        *e = Some(*r);
    }
    runs.push(run);
    let keep = runs.len().saturating_sub(EARLIER_RUNS + 1);
    let bytes: Vec<u8> = runs[keep..]
        .iter()
        .flat_map(|r| r.id.to_be_bytes().into_iter().chain(r.began.to_be_bytes()))
        .collect();
    write_private(&path, &bytes)
        .with_context(|| format!("cannot note the run in {}", path.display()))?;
    Ok((run, earlier))
}

/// The group key of `driver`: read from the ndd home, or drawn and written there (0600).
pub(super) fn current_key(home: &Path, prefix: &str, driver: &str) -> Result<[u8; 32]> {
    use std::os::unix::fs::PermissionsExt;
    let path = key_path(home, prefix, driver);
    match std::fs::read(&path) {
        Ok(b) => {
            let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                bail!(
                    "{} has permissions {mode:04o}, but it must be readable by its owner only; fix it with: chmod 600 {}",
                    path.display(),
                    path.display()
                );
            }
            <[u8; 32]>::try_from(b.as_slice()).map_err(|_| {
                anyhow!(
                    "{} holds {} bytes, not a 32-byte group key; delete it to draw a new one (app sides then join again)",
                    path.display(),
                    b.len()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = draw_key()?;
            write_private(&path, &k)
                .with_context(|| format!("cannot write the group key {}", path.display()))?;
            let _ = std::fs::remove_file(holders_path(home, prefix, driver));
            let _ = std::fs::remove_file(previous_path(home, prefix, driver));
            Ok(k)
        }
        Err(e) => Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    }
}

/// What an app side keeps for the next process of an ordered stored stream ([`Kept`]: where
/// its consumer first started and where the stream stands), in the ndd home: one file per
/// durable consumer (`nats-position-PREFIX-DRIVER-DURABLE`, mode 0600), written in place
/// before each acknowledgement (one 56-byte write: the last one survives the process, and a
/// torn one fails its check and keeps nothing). The next process of this app side takes its
/// consumer up from the first message not acknowledged and its order from here.
pub(super) struct PositionFile {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// A write failed and was said (once).
    failed: bool,
}

impl PositionFile {
    pub(super) fn open(
        home: &Path,
        prefix: &str,
        driver: &str,
        durable: &str,
    ) -> Result<PositionFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = home.join(format!("nats-position-{prefix}-{driver}-{durable}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(PositionFile {
            file,
            path,
            failed: false,
        })
    }

    /// What is kept (none: never written, cleared, or torn).
    pub(super) fn read(&self) -> Option<Kept> {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; Kept::LEN + 1];
        let n = self.file.read_at(&mut b, 0).ok()?;
        Kept::parse(&b[..n])
    }

    /// Keeps `p`.
    pub(super) fn write(&mut self, p: Kept) {
        use std::os::unix::fs::FileExt;
        if let Err(e) = self.file.write_all_at(&p.encode(), 0) {
            // An older position left in place would be wrong: none at all is safe.
            let _ = self.file.set_len(0);
            if !std::mem::replace(&mut self.failed, true) {
                tracing::warn!(
                    side = "app",
                    "cannot note where the stream stands in {}: {e} (after a restart, frames this side took already may come again)",
                    self.path.display()
                );
            }
        }
    }

    /// Forgets the position (a new consumer: the one it belonged to is gone).
    pub(super) fn clear(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// The fingerprints in a holders file (missing: none).
pub(super) fn holders(path: &Path) -> Result<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    }
}

/// Notes that `fp` holds the current group key.
pub(super) fn add_holder(path: &Path, fp: &str) -> Result<()> {
    let mut all = holders(path)?;
    if all.iter().any(|h| h == fp) {
        return Ok(());
    }
    all.push(fp.to_owned());
    write_private(path, (all.join("\n") + "\n").as_bytes())
}
