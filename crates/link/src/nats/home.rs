//! The NATS link's files in the ndd home: a device side's group key, who holds it, the keys
//! its last rotations retired, its split slots and its runs; an app side's positions in its
//! stored streams. Their formats and their rules (mode 0600, atomic replacement, what a
//! damaged file means) live here; the binary only says where the home is ([`Home`]).
//!
//! | file | what |
//! |---|---|
//! | `nats-group-P-D.key` | the group key, 32 bytes |
//! | `nats-group-P-D.holders` | who was handed that key, one fingerprint a line |
//! | `nats-group-P-D.previous` | the keys the last rotations retired, and a rotation under way ([`parse_retired`]) |
//! | `nats-group-P-D.run` | the device side's last runs, oldest first ([`parse_runs`]) |
//! | `nats-slots-P-D` | the split slots held (`SLOT FINGERPRINT` a line) |
//! | `nats-position-P-D-DURABLE` | where an ordered stored stream stands ([`Kept`]) |
//!
//! (`P` the subject prefix, `D` the driver.)

use super::intake::Kept;
use super::keys::{GroupKey, EARLIER_RUNS};
use super::opened::OpenedWindows;
use super::rotate::{encode_pending, encode_retired, parse_retired, Retired};
use super::runs::{next_run_id, Run};
use std::io;
use std::path::{Path, PathBuf};

/// What went wrong with a file of the NATS link in the ndd home. Every text names the file
/// and, where the user can fix it, how.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HomeError {
    /// A file operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "write", …).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The group key file is readable by others.
    #[error(
        "{} has permissions {mode:04o}, but it must be readable by its owner only; fix it with: chmod 600 {}",
        path.display(),
        path.display()
    )]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The group key file does not hold 32 bytes.
    #[error(
        "{} holds {len} bytes, not a 32-byte group key; delete it to draw a new one (app sides then join again)",
        path.display()
    )]
    KeyLength {
        /// The key file.
        path: PathBuf,
        /// What it holds.
        len: usize,
    },
    /// The run file does not hold runs.
    #[error(
        "{} holds {len} bytes, not run ids (8, or 16 per run); delete it if no earlier run of this driver can be replayed into the next (app sides then refuse nothing of earlier runs that a clock set back would number higher)",
        path.display()
    )]
    RunFile {
        /// The run file.
        path: PathBuf,
        /// What it holds.
        len: usize,
    },
    /// A run began with an id not above the last one noted (two device sides starting in
    /// the same home at once).
    #[error(
        "{} names run {last:016x}, and this run's id {id:016x} is not above it: another device side began a run in this home meanwhile (only one may run a driver)",
        path.display()
    )]
    RunOrder {
        /// The run file.
        path: PathBuf,
        /// The id this run was to take.
        id: u64,
        /// The last one noted.
        last: u64,
    },
    /// The system's random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HomeError + 'a {
    move |source| HomeError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// 32 fresh random bytes.
pub fn draw_key() -> Result<[u8; 32], HomeError> {
    use ring::rand::SecureRandom;
    let mut k = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut k)
        .map_err(|_| HomeError::Random)?;
    Ok(k)
}

/// Replaces `path` with `bytes` atomically (a new file renamed over it, synced first),
/// readable by its owner only; creates its directory.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), HomeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    }
    // Its own temporary file (`with_extension` would give `.key` and `.holders` the same
    // one, and the join service and a rotation write those at once).
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
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
    .map_err(io_err("write", path))
}

/// A run file's runs, oldest first: `id (u64 BE) ‖ began (u64 BE)` each; the file of a
/// version before 2026-11-29 holds the last id alone (8 bytes, `began` unknown: 0). `Err`:
/// the length, which is neither.
pub fn parse_runs(b: &[u8]) -> Result<Vec<Run>, usize> {
    let u64_at = |at: usize| {
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(n)
    };
    match b.len() {
        8 => Ok(vec![Run {
            id: u64_at(0),
            began: 0,
        }]),
        n if n > 0 && n % 16 == 0 => Ok((0..n / 16)
            .map(|i| Run {
                id: u64_at(16 * i),
                began: u64_at(16 * i + 8),
            })
            .collect()),
        n => Err(n),
    }
}

/// The run file's bytes for `runs` (see [`parse_runs`]).
pub fn encode_runs(runs: &[Run]) -> Vec<u8> {
    runs.iter()
        .flat_map(|r| r.id.to_be_bytes().into_iter().chain(r.began.to_be_bytes()))
        .collect()
}

/// One driver's NATS files in one ndd home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    dir: PathBuf,
    prefix: String,
    driver: String,
}

impl Home {
    /// The files of `driver` under subject prefix `prefix` in the ndd home `dir`.
    pub fn new(dir: &Path, prefix: &str, driver: &str) -> Home {
        Home {
            dir: dir.to_path_buf(),
            prefix: prefix.to_owned(),
            driver: driver.to_owned(),
        }
    }

    /// The ndd home.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn group_file(&self, ext: &str) -> PathBuf {
        self.dir
            .join(format!("nats-group-{}-{}.{ext}", self.prefix, self.driver))
    }

    /// The group key.
    pub fn key_path(&self) -> PathBuf {
        self.group_file("key")
    }

    /// Who was handed the group key now in [`Home::key_path`] (one fingerprint a line): if
    /// one of them is no longer trusted, the key is rotated.
    pub fn holders_path(&self) -> PathBuf {
        self.group_file("holders")
    }

    /// The keys the last rotations retired, newest first, with the JetStream sequence of
    /// each rotation, and whether the last one is under way ([`parse_retired`]); mode 0600.
    pub fn previous_path(&self) -> PathBuf {
        self.group_file("previous")
    }

    /// The device side's last runs, oldest first ([`parse_runs`]), at most
    /// [`EARLIER_RUNS`] + 1.
    pub fn run_path(&self) -> PathBuf {
        self.group_file("run")
    }

    /// The split slots held (`SLOT FINGERPRINT` a line): a restarted device side gives each
    /// app side its slot back.
    pub fn slots_path(&self) -> PathBuf {
        self.dir
            .join(format!("nats-slots-{}-{}", self.prefix, self.driver))
    }

    /// The id reserved last for a run ([`Home::reserve_run_id`]).
    pub fn reserved_path(&self) -> PathBuf {
        self.dir.join(format!(
            "nats-group-{}-{}.reserved",
            self.prefix, self.driver
        ))
    }

    /// What a device side's sink read by consumer `durable` opened ([`WindowsFile`]).
    pub fn windows_path(&self, durable: &str) -> PathBuf {
        self.dir.join(format!(
            "nats-opened-{}-{}-{durable}",
            self.prefix, self.driver
        ))
    }

    /// Where an app side keeps the position of its ordered consumer `durable`.
    pub fn position_path(&self, durable: &str) -> PathBuf {
        self.dir.join(format!(
            "nats-position-{}-{}-{durable}",
            self.prefix, self.driver
        ))
    }

    /// The group key: read, or drawn and written (0600) when there is none, which also
    /// forgets who held the one before and what it retired.
    pub fn current_key(&self) -> Result<[u8; 32], HomeError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.key_path();
        match std::fs::read(&path) {
            Ok(b) => {
                let meta = std::fs::metadata(&path).map_err(io_err("read", &path))?;
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(HomeError::KeyPermissions { path, mode });
                }
                <[u8; 32]>::try_from(b.as_slice())
                    .map_err(|_| HomeError::KeyLength { path, len: b.len() })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let k = draw_key()?;
                write_private(&path, &k)?;
                let _ = std::fs::remove_file(self.holders_path());
                let _ = std::fs::remove_file(self.previous_path());
                Ok(k)
            }
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// The group key and what its last rotations left, for the device run `run` after the
    /// runs `earlier`. A damaged `.previous` file is said and left out (frames sealed
    /// before the last rotation and not yet read will not open). A rotation that was under
    /// way when the side stopped is completed as of where the stream stood when it began
    /// ([`Retired::under`]), said, and written so.
    pub fn group_key(
        &self,
        run: Run,
        earlier: [Option<Run>; EARLIER_RUNS],
    ) -> Result<GroupKey, HomeError> {
        let keys = GroupKey {
            earlier,
            ..GroupKey::first(self.current_key()?, run)
        };
        let path = self.previous_path();
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
        let unrotated = retired.previous.is_some_and(|(k, _)| k == keys.key);
        let keys = retired.under(keys);
        if retired.pending {
            if !unrotated {
                tracing::warn!(
                    side = "device",
                    since = keys.since,
                    "the group key's rotation was under way when this side stopped: it is complete as of where the JetStream stream stood when it began (nothing the revoked side stored later opens); device frames published just before it may not reach the app sides"
                );
            } else {
                tracing::warn!(
                    side = "device",
                    "the group key's rotation had begun when this side stopped, before its new key was written: it begins again"
                );
            }
            write_private(&path, &encode_retired(&keys))?;
        }
        Ok(keys)
    }

    /// A new run of the device side, beginning after JetStream stream sequence `began`, and
    /// the runs before it (newest first); noted in the run file before any frame of it is
    /// sealed. Its id is higher than the last one noted ([`next_run_id`] of `wall_ns` and
    /// `random`), so a recording of an earlier run never passes for a later one.
    pub fn new_run(
        &self,
        began: u64,
        wall_ns: u64,
        random: u16,
    ) -> Result<(Run, [Option<Run>; EARLIER_RUNS]), HomeError> {
        let id = self.reserve_run_id(wall_ns, random)?;
        self.begin_run(id, began)
    }

    /// The id the next run takes ([`next_run_id`] of the last one noted or reserved,
    /// `wall_ns` and `random`), noted as reserved (`nats-group-P-D.reserved`) before it is
    /// returned: a device side claims the driver with it and marks it in the JetStream stream
    /// before it reads where the stream stands, then begins it with [`Home::begin_run`]. A
    /// process that dies in between leaves the reservation, so the next run's id is higher
    /// than every id marked (an app side that read a mark is behind only until it joins a
    /// run that began).
    pub fn reserve_run_id(&self, wall_ns: u64, random: u16) -> Result<u64, HomeError> {
        let (runs, _) = self.runs()?;
        let path = self.reserved_path();
        let reserved = match std::fs::read(&path) {
            Ok(b) => Some(
                <[u8; 8]>::try_from(b.as_slice())
                    .map(u64::from_be_bytes)
                    .map_err(|_| HomeError::RunFile {
                        path: path.clone(),
                        len: b.len(),
                    })?,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let last = runs.last().map(|r| r.id).max(reserved);
        let id = next_run_id(last, wall_ns, random);
        write_private(&path, &id.to_be_bytes())?;
        Ok(id)
    }

    /// Run `id` (from [`Home::reserve_run_id`]), beginning after JetStream stream sequence
    /// `began`, noted in the run file; the runs before it, newest first.
    pub fn begin_run(
        &self,
        id: u64,
        began: u64,
    ) -> Result<(Run, [Option<Run>; EARLIER_RUNS]), HomeError> {
        let (all, mut runs) = self.runs()?;
        if let Some(last) = all.last().filter(|r| r.id >= id) {
            return Err(HomeError::RunOrder {
                path: self.run_path(),
                id,
                last: last.id,
            });
        }
        let run = Run { id, began };
        let mut earlier = [None; EARLIER_RUNS];
        for (e, r) in earlier.iter_mut().zip(runs.iter().rev()) {
            *e = Some(*r);
        }
        runs.push(run);
        let keep = runs.len().saturating_sub(EARLIER_RUNS + 1);
        write_private(&self.run_path(), &encode_runs(&runs[keep..]))?;
        Ok((run, earlier))
    }

    /// The runs noted, oldest first (the last id alone counts for the 8-byte file of an
    /// earlier version, whose start is unknown: no earlier run to give the app sides), and
    /// the runs to go on from.
    fn runs(&self) -> Result<(Vec<Run>, Vec<Run>), HomeError> {
        let path = self.run_path();
        match std::fs::read(&path) {
            Ok(b) => {
                let runs = parse_runs(&b).map_err(|len| HomeError::RunFile {
                    path: path.clone(),
                    len,
                })?;
                let kept = if b.len() == 8 {
                    Vec::new()
                } else {
                    runs.clone()
                };
                Ok((runs, kept))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((Vec::new(), Vec::new())),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// The fingerprints in the holders file (none when it is missing).
    pub fn holders(&self) -> Result<Vec<String>, HomeError> {
        let path = self.holders_path();
        match std::fs::read_to_string(&path) {
            Ok(t) => Ok(t
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// Notes that `fp` holds the current group key.
    pub fn add_holder(&self, fp: &str) -> Result<(), HomeError> {
        let mut all = self.holders()?;
        if all.iter().any(|h| h == fp) {
            return Ok(());
        }
        all.push(fp.to_owned());
        write_private(&self.holders_path(), (all.join("\n") + "\n").as_bytes())
    }

    /// A rotation began ([`super::rotate::Action::Rotate`]): its `keys`, `since` still
    /// pending, as the stream stood at `began`. In this order, so that a side that stops at
    /// any point reads back keys that open what was stored ([`Home::group_key`]): the retired
    /// keys with the rotation under way ([`encode_pending`]; stopped here, the rotation never
    /// happened and its next check rotates again), the key file replaced (stopped here, the
    /// rotation is complete as of `began`, and its next check rotates once more, harmlessly:
    /// the holders file still names the revoked side), the holders file emptied.
    pub fn rotated(&self, keys: &GroupKey, began: u64) -> Result<(), HomeError> {
        write_private(&self.previous_path(), &encode_pending(keys, began))?;
        write_private(&self.key_path(), &keys.key)?;
        write_private(&self.holders_path(), b"")
    }

    /// The split slots the run before this one left (lines that are not a slot and a
    /// fingerprint are said and left out; none when there is no file).
    pub fn slots(&self) -> Vec<(u16, String)> {
        let path = self.slots_path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Vec::new();
        };
        let (held, bad) = super::admit::parse_slots(&text);
        if bad > 0 {
            tracing::warn!(
                side = "device",
                "{}: {bad} lines are not a slot and a fingerprint; left out",
                path.display()
            );
        }
        held
    }
}

/// What an app side keeps for the next process of an ordered stored stream ([`Kept`]: where
/// its consumer first started and where the stream stands), in [`Home::position_path`]
/// (mode 0600), written in place before each acknowledgement (one 56-byte write: the last
/// one survives the process, and a torn one fails its check and keeps nothing). The next
/// process of this app side takes its consumer up from the first message not acknowledged
/// and its order from here.
#[derive(Debug)]
pub struct PositionFile {
    file: std::fs::File,
    path: PathBuf,
    /// A write failed and was said (once).
    failed: bool,
}

impl PositionFile {
    /// Opens (or creates) the position of consumer `durable`.
    pub fn open(home: &Home, durable: &str) -> Result<PositionFile, HomeError> {
        let path = home.position_path(durable);
        let file = open_kept(&path)?;
        Ok(PositionFile {
            file,
            path,
            failed: false,
        })
    }

    /// What is kept (none: never written, cleared, or torn).
    pub fn read(&self) -> Option<Kept> {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; Kept::LEN + 1];
        let n = self.file.read_at(&mut b, 0).ok()?;
        Kept::parse(&b[..n])
    }

    /// Keeps `p` (a failed write empties the file, said once: an older position left in
    /// place would be wrong, none at all is safe).
    pub fn write(&mut self, p: Kept) {
        use std::os::unix::fs::FileExt;
        if let Err(e) = self.file.write_all_at(&p.encode(), 0) {
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
    pub fn clear(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// Opens (or creates, mode 0600) a file a stream keeps for its next process, read and
/// written in place ([`PositionFile`], [`WindowsFile`]).
fn open_kept(path: &Path) -> Result<std::fs::File, HomeError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open", path))
}

/// What a device side's sink of a reliable app → device stream opened, kept in its home for
/// its next process ([`OpenedWindows`]): written before each acknowledgement, so a copy of a
/// frame acknowledged already is known for one by the next process. Written in place (one
/// `pwrite` of a few KB: a new file renamed over the old each time blocked the sink's
/// acknowledgements under load, and a kill before its next process began then let more
/// frames come twice); the encoding only grows (epochs are added, up to 64), so a write never
/// leaves an older tail, and one cut short by a kill fails its check: nothing is carried, as
/// before there were windows.
#[derive(Debug)]
pub struct WindowsFile {
    file: std::fs::File,
    path: PathBuf,
    /// The bytes written last (nothing is written again while they stand).
    last: Vec<u8>,
    /// A write failed and was said (once).
    failed: bool,
}

impl WindowsFile {
    /// Opens (or creates) the windows of consumer `durable`.
    pub fn open(home: &Home, durable: &str) -> Result<WindowsFile, HomeError> {
        let path = home.windows_path(durable);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        }
        let file = open_kept(&path)?;
        Ok(WindowsFile {
            file,
            path,
            last: Vec::new(),
            failed: false,
        })
    }

    /// What the process before kept: `Ok(None)` when nothing was (a first run), `Err` with
    /// the path when the file is damaged (cut short by a kill or a crash, or not ndd's).
    pub fn read(&self) -> Result<Option<OpenedWindows>, PathBuf> {
        use std::io::{Read, Seek};
        let mut b = Vec::new();
        let mut f = &self.file;
        // From the start, whatever was read before (the device's sink reads it twice: where a
        // consumer made afresh starts, then the windows; the second read found nothing, and a
        // copy of a frame the process before took was taken again: found by
        // `a_copy_stored_while_the_device_restarts_is_not_taken_again`).
        if f.rewind().is_err() || f.read_to_end(&mut b).is_err() {
            return Err(self.path.clone());
        }
        if b.is_empty() {
            return Ok(None);
        }
        OpenedWindows::parse(&b)
            .map(Some)
            .ok_or_else(|| self.path.clone())
    }

    /// Keeps the windows `b` ([`OpenedWindows::encode`]; a failed write empties the file,
    /// said once: windows that lag behind what was acknowledged would let copies through as
    /// surely as none).
    pub fn write(&mut self, b: &[u8]) {
        use std::os::unix::fs::FileExt;
        if b == self.last {
            return;
        }
        let r = self
            .file
            .write_all_at(b, 0)
            .and_then(|()| self.file.set_len(b.len() as u64));
        match r {
            Ok(()) => self.last = b.to_vec(),
            Err(e) => {
                let _ = self.file.set_len(0);
                self.last.clear();
                if !std::mem::replace(&mut self.failed, true) {
                    tracing::warn!(
                        side = "device",
                        "cannot note what this side opened in {}: {e} (after a restart, copies of frames it took already may be taken again)",
                        self.path.display()
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ndd-home-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_windows_kept_read_the_same_however_often_they_are_read() {
        let dir = scratch("windows");
        let h = Home::new(&dir, "P", "d");
        let mut f = WindowsFile::open(&h, "dev-1").unwrap();
        assert_eq!(f.read(), Ok(None), "nothing kept yet");
        let mut w = OpenedWindows::default();
        let mut sealed = vec![7u8; 16];
        sealed.extend_from_slice(&5u64.to_be_bytes());
        w.mark(&sealed);
        w.handle_through(30);
        f.write(&w.encode());
        let again = WindowsFile::open(&h, "dev-1").unwrap();
        for _ in 0..3 {
            let back = again.read().unwrap().expect("kept");
            assert_eq!(back.through(), 30);
            assert!(back.covers(&sealed));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_device_notes_its_runs_and_names_the_ones_before() {
        let dir = scratch("runs");
        let h = Home::new(&dir, "P", "d");
        let mut wall = 1_000_000_000u64;
        let mut new_run = |began| {
            wall += 1_000_000;
            h.new_run(began, wall, 3)
        };
        std::fs::create_dir_all(&dir).unwrap();
        // The file of an earlier version: the last id alone (its start unknown).
        std::fs::write(h.run_path(), 7u64.to_be_bytes()).unwrap();
        let (a, earlier) = new_run(10).unwrap();
        assert!(a.id > 7);
        assert_eq!(earlier, [None; EARLIER_RUNS]);
        let (b, earlier) = new_run(20).unwrap();
        assert!(b.id > a.id);
        assert_eq!(earlier[..3], [Some(a), None, None]);
        let mut runs = vec![a, b];
        for began in (3..=EARLIER_RUNS as u64 + 2).map(|i| i * 10) {
            let (r, earlier) = new_run(began).unwrap();
            let mut want = [None; EARLIER_RUNS];
            for (w, r) in want.iter_mut().zip(runs.iter().rev()) {
                *w = Some(*r);
            }
            assert_eq!(earlier, want);
            assert!(r.id > runs.last().unwrap().id);
            runs.push(r);
        }
        // EARLIER_RUNS + 1 runs kept, 16 bytes each, mode 0600.
        let b = std::fs::read(h.run_path()).unwrap();
        assert_eq!(b.len(), 16 * (EARLIER_RUNS + 1));
        assert_eq!(
            parse_runs(&b).unwrap(),
            runs[runs.len() - EARLIER_RUNS - 1..]
        );
        let mode = std::fs::metadata(h.run_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Reserved (and marked) first, begun after: the id the run takes is the one reserved;
        // one reserved by a process that died before it began is never taken again, whatever
        // the clock says.
        let later = 2_000_000_000u64;
        let died = h.reserve_run_id(later, 3).unwrap();
        assert!(died > runs.last().unwrap().id);
        let id = h.reserve_run_id(later, 3).unwrap();
        assert!(id > died, "a reserved id is never taken again");
        let (r, earlier) = h.begin_run(id, 999).unwrap();
        assert_eq!(r, Run { id, began: 999 });
        assert_eq!(earlier[0], runs.last().copied());
        // Two device sides in one home: the second to begin, with an id not above the first's,
        // is refused by name.
        let e = h.begin_run(died, 1000).unwrap_err().to_string();
        assert!(
            e.contains("another device side began a run in this home"),
            "{e}"
        );
        assert!(h.reserve_run_id(1, 3).unwrap() > id, "a clock set back");
        std::fs::write(h.run_path(), [1u8; 5]).unwrap();
        let e = new_run(60).unwrap_err().to_string();
        assert!(
            e.contains("nats-group-P-d.run holds 5 bytes, not run ids (8, or 16 per run)"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_group_key_is_drawn_once_kept_private_and_refused_when_damaged() {
        let dir = scratch("key");
        let h = Home::new(&dir, "P", "d");
        std::fs::create_dir_all(&dir).unwrap();
        // A new key forgets who held the one before.
        std::fs::write(h.holders_path(), "old\n").unwrap();
        let k = h.current_key().unwrap();
        assert_eq!(h.current_key().unwrap(), k);
        assert!(h.holders().unwrap().is_empty());
        h.add_holder("a").unwrap();
        h.add_holder("b").unwrap();
        h.add_holder("a").unwrap();
        assert_eq!(h.holders().unwrap(), ["a", "b"]);
        let fresh = draw_key().unwrap();
        assert_ne!(fresh, k);
        let run = Run { id: 1, began: 0 };
        let r =
            crate::nats::keys::rotation(GroupKey::first(k, run), &["a".into()], |_| false, fresh);
        h.rotated(&r.unwrap().keys, 9).unwrap();
        assert_eq!(h.current_key().unwrap(), fresh);
        assert!(h.holders().unwrap().is_empty());
        let path = h.key_path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = h.current_key().unwrap_err().to_string();
        assert!(
            e.ends_with(&format!(
                "has permissions 0644, but it must be readable by its owner only; fix it with: chmod 600 {}",
                path.display()
            )),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
        write_private(&path, &[0u8; 7]).unwrap();
        let e = h.current_key().unwrap_err().to_string();
        assert!(e.contains("holds 7 bytes, not a 32-byte group key"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The files a rotation leaves at each point a device side may stop at, read back by the
    /// next process: keys that open what was stored, the revoked side's key retired where the
    /// stream stood when the rotation began.
    #[test]
    fn a_rotation_under_way_when_the_side_stopped_is_completed_where_it_began() {
        use crate::nats::keys::rotation;
        let dir = scratch("pending");
        let h = Home::new(&dir, "P", "d");
        let run = |id| Run { id, began: 3 };
        let first = h.group_key(run(1), [None; EARLIER_RUNS]).unwrap();
        h.add_holder("a").unwrap();
        h.add_holder("b").unwrap();
        let holders = h.holders().unwrap();
        let fresh = draw_key().unwrap();
        let r = rotation(first, &holders, |f| f != "a", fresh).unwrap();
        h.rotated(&r.keys, 40).unwrap();
        assert_eq!(
            parse_retired(&std::fs::read(h.previous_path()).unwrap()).map(|r| r.pending),
            Ok(true)
        );
        // It stops here (before `Complete`): the next process has the rotation complete as
        // of 40, and the file says so from now on.
        let back = h.group_key(run(2), [None; EARLIER_RUNS]).unwrap();
        assert_eq!(
            (back.key, back.previous, back.since, back.run),
            (fresh, Some(first.key), 40, run(2))
        );
        assert!(h.holders().unwrap().is_empty());
        let file = std::fs::read(h.previous_path()).unwrap();
        assert_eq!(file, encode_retired(&back));
        assert_eq!(h.group_key(run(2), [None; EARLIER_RUNS]).unwrap(), back);
        let mode = std::fs::metadata(h.previous_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // The next rotation: it stops after the retired keys were written, before the key
        // file was replaced. The rotation never happened: the keys before it, and the holders
        // file still names the revoked side (the next check rotates again).
        h.add_holder("b").unwrap();
        let next = rotation(back, &["b".to_owned()], |_| false, [7; 32]).unwrap();
        write_private(&h.previous_path(), &encode_pending(&next.keys, 55)).unwrap();
        assert_eq!(h.group_key(run(2), [None; EARLIER_RUNS]).unwrap(), back);
        assert_eq!(std::fs::read(h.previous_path()).unwrap(), file);
        assert_eq!(h.holders().unwrap(), ["b"]);
        // A file of an earlier version (complete, no mark) reads as before.
        write_private(&h.previous_path(), &file).unwrap();
        assert_eq!(h.group_key(run(2), [None; EARLIER_RUNS]).unwrap(), back);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn run_files_parse_and_encode() {
        let runs = [Run { id: 9, began: 4 }, Run { id: 12, began: 80 }];
        assert_eq!(parse_runs(&encode_runs(&runs)).unwrap(), runs);
        // An empty file is damaged (the last id lost), not "no runs": a missing file is that.
        assert_eq!(parse_runs(&[]), Err(0));
        assert_eq!(parse_runs(&[0; 24]), Err(24));
        assert_eq!(
            parse_runs(&5u64.to_be_bytes()).unwrap(),
            [Run { id: 5, began: 0 }]
        );
    }
}
