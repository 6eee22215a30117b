//! Where things go on the NATS server (sans-IO). With prefix `P` and driver `D`:
//!
//! | subject | what |
//! |---|---|
//! | `P.D.join` | app sides' join requests (the device answers: [`super::join`]) |
//! | `P.D.d.S` | device → app frames of stream `S`, core NATS (lossy streams) |
//! | `P.D.d.S.I` | piece `I` of each frame (`multiplex` split) |
//! | `P.D.r.S` / `P.D.r.S.I` | the same for reliable streams, stored by JetStream |
//! | `P.D.d.S.end` | the end of stream `S`, for round-robin app sides |
//! | `P.D.ready` | an admitted app side has subscribed (a frame sealed under the group key) |
//! | `P.D.u.S` / `P.D.r.u.S` | app → device frames of stream `S`, lossy / reliable (every app side publishes there) |
//!
//! JetStream stream `NDD_P_D` holds `P.D.r.>`; round-robin app sides share the queue group
//! (core) or durable consumer (JetStream) `P_D_S`.

/// Longest prefix or driver name, in bytes.
pub const MAX_TOKEN: usize = 64;

/// Checks that `s` can be one subject token: 1..=64 bytes of letters, digits, `-` and `_`.
/// `key` names the setting in the error.
pub fn check_token(key: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_TOKEN {
        return Err(format!(
            "{key} = {s:?}: must be 1 to {MAX_TOKEN} characters"
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "{key} = {s:?}: {c:?} cannot be part of a NATS subject token (use letters, digits, - and _)"
        ));
    }
    Ok(())
}

/// The subjects of one driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    base: String,
    prefix: String,
    driver: String,
}

impl Subjects {
    /// The subjects under `prefix.driver`; both must pass [`check_token`].
    pub fn new(prefix: &str, driver: &str) -> Result<Subjects, String> {
        check_token("link.nats.subject_prefix", prefix)?;
        check_token("driver (on the NATS link)", driver)?;
        Ok(Subjects {
            base: format!("{prefix}.{driver}"),
            prefix: prefix.into(),
            driver: driver.into(),
        })
    }

    /// The subject prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The driver.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// Join requests.
    pub fn join(&self) -> String {
        format!("{}.join", self.base)
    }

    /// Where the device side that serves the driver answers (another device side starting on
    /// the same driver asks here first, and stops if it gets an answer).
    pub fn device(&self) -> String {
        format!("{}.device", self.base)
    }

    /// Device → app frames of `stream` (`part` for a split piece); `reliable` puts them
    /// under JetStream's subjects.
    pub fn down(&self, stream: u16, reliable: bool, part: Option<u16>) -> String {
        let kind = if reliable { "r" } else { "d" };
        match part {
            Some(i) => format!("{}.{kind}.{stream}.{i}", self.base),
            None => format!("{}.{kind}.{stream}", self.base),
        }
    }

    /// Where the device also says that `stream` ended, for app sides that share a
    /// round-robin stream (each of them sees only some of its frames).
    pub fn end(&self, stream: u16) -> String {
        format!("{}.d.{stream}.end", self.base)
    }

    /// Where an admitted app side says it subscribed everything (the device's
    /// `min_app_sides` counts these).
    pub fn ready(&self) -> String {
        format!("{}.ready", self.base)
    }

    /// Where the device says it rotated the group key (an app side that was not told so
    /// learns it from a frame that does not open): app sides ask for the new one by joining
    /// again. The message carries nothing secret (anyone may publish one: it costs a join).
    pub fn rekey(&self) -> String {
        format!("{}.rekey", self.base)
    }

    /// App → device frames of `stream`; `reliable` puts them under JetStream's subjects
    /// (`P.D.r.u.S`).
    pub fn up_stored(&self, stream: u16) -> String {
        format!("{}.r.u.{stream}", self.base)
    }

    /// The device's durable consumer of a reliable app → device stream.
    pub fn device_durable(&self, stream: u16) -> String {
        format!("device_{stream}")
    }

    /// App → device frames of `stream`.
    pub fn up(&self, stream: u16) -> String {
        format!("{}.u.{stream}", self.base)
    }

    /// The JetStream stream holding the reliable streams.
    pub fn jetstream(&self) -> String {
        format!("NDD_{}_{}", self.prefix, self.driver)
    }

    /// Where a device side marks run `run` (in hex) in the JetStream stream before it reads
    /// where the stream stands (a rekey notice signed by its identity): an app side that
    /// confirms the device's run while no device side serves reads here whether a run newer
    /// than its own began (`super::follow::Follower::behind`).
    pub fn run_mark(&self, run: u64) -> String {
        format!("{}.r.runs.{run:016x}", self.base)
    }

    /// Every run's mark (a filter of [`Subjects::run_mark`]'s).
    pub fn run_marks(&self) -> String {
        format!("{}.r.runs.>", self.base)
    }

    /// The run a mark's subject names ([`Subjects::run_mark`]): exactly its spelling, so the
    /// run's mark subject is the subject listed.
    pub fn run_of_mark(&self, subject: &str) -> Option<u64> {
        let hex = subject.strip_prefix(&self.base)?.strip_prefix(".r.runs.")?;
        (hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
    }

    /// What the JetStream stream holds.
    pub fn jetstream_subjects(&self) -> String {
        format!("{}.r.>", self.base)
    }

    /// The queue group (and shared durable consumer) of round-robin app sides of `stream`.
    pub fn group(&self, stream: u16) -> String {
        format!("{}_{}_{stream}", self.prefix, self.driver)
    }

    /// The durable consumer of one app side (`who`: a short id of its identity) on
    /// `stream` (`part`: its split slot).
    pub fn durable(&self, who: &str, stream: u16, part: Option<u16>) -> String {
        match part {
            Some(i) => format!("{who}_{stream}_{i}"),
            None => format!("{who}_{stream}"),
        }
    }
}

/// What one side's NATS user may do, for the server's `authorization` block
/// ([`Subjects::permissions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish on.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether it may answer requests made to it (the device side answers joins and claims).
    pub allow_responses: bool,
}

impl Permissions {
    /// The block as nats-server's configuration writes it.
    pub fn to_conf(&self) -> String {
        let list = |v: &[String]| {
            v.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "{{\n  publish: {{ allow: [{}] }}\n  subscribe: {{ allow: [{}] }}\n  allow_responses: {}\n}}",
            list(&self.publish),
            list(&self.subscribe),
            self.allow_responses
        )
    }
}

impl Subjects {
    /// What a side's own NATS user needs on this driver and no more, its replies under
    /// `inbox_prefix` (its `link.nats.inbox_prefix`), its JetStream consumers `consumers`
    /// (the device's `device_S` of each reliable app → device stream; an app side's own
    /// durable consumers and the round-robin groups it is in, [`Subjects::durable`],
    /// [`Subjects::group`]). The device side publishes on the driver's subjects, keeps its
    /// JetStream stream and answers requests; an app side publishes only joins, its ready
    /// beats and app → device frames, reads only device → app frames and rekey notices, and
    /// reads the JetStream stream only through its own consumers (it cannot create, change,
    /// purge or delete the stream, nor pull from, acknowledge on or delete another side's
    /// consumer). Neither may read or publish into another client's inboxes, so nobody forges
    /// the answers a side is sent (JetStream's own included).
    pub fn permissions(
        &self,
        device: bool,
        inbox_prefix: &str,
        consumers: &[String],
    ) -> Result<Permissions, String> {
        check_token("the inbox prefix", inbox_prefix)?;
        for c in consumers {
            check_token("a JetStream consumer", c)?;
        }
        let (b, js) = (&self.base, self.jetstream());
        let mut publish = Vec::new();
        let mut subscribe = Vec::new();
        if device {
            publish.push(format!("{b}.>"));
            subscribe.push(format!("{b}.>"));
            publish.extend([
                format!("$JS.API.STREAM.CREATE.{js}"),
                format!("$JS.API.STREAM.UPDATE.{js}"),
                // Its earlier runs' marks, once its own is stored.
                format!("$JS.API.STREAM.PURGE.{js}"),
            ]);
        } else {
            publish.extend([
                self.join(),
                self.ready(),
                format!("{b}.u.>"),
                format!("{b}.r.u.>"),
            ]);
            subscribe.extend([format!("{b}.d.>"), self.rekey()]);
        }
        publish.extend([
            "$JS.API.INFO".to_string(),
            format!("$JS.API.STREAM.INFO.{js}"),
            // An app side reads the device's run marks ([`Subjects::run_mark`]) when it
            // confirms the device's run while no device side serves: NATS cannot narrow a
            // stored message's read to a subject (it is in the request's body), so it may read
            // any; every record in the stream is sealed under keys an admitted app side holds.
            format!("$JS.API.STREAM.MSG.GET.{js}"),
        ]);
        for c in consumers {
            publish.extend([
                format!("$JS.API.CONSUMER.CREATE.{js}.{c}"),
                format!("$JS.API.CONSUMER.CREATE.{js}.{c}.>"),
                format!("$JS.API.CONSUMER.DURABLE.CREATE.{js}.{c}"),
                format!("$JS.API.CONSUMER.INFO.{js}.{c}"),
                format!("$JS.API.CONSUMER.MSG.NEXT.{js}.{c}"),
                format!("$JS.API.CONSUMER.DELETE.{js}.{c}"),
                format!("$JS.ACK.{js}.{c}.>"),
            ]);
        }
        subscribe.push(format!("{inbox_prefix}.>"));
        Ok(Permissions {
            publish,
            subscribe,
            allow_responses: device,
        })
    }
}

/// The short id of an identity in its durable consumers' names (from its fingerprint).
pub fn who(fingerprint: &str) -> String {
    let h = ndd_wire::param_hash(fingerprint);
    format!("a{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let s = Subjects::new("ndd", "cam").unwrap();
        assert_eq!(s.join(), "ndd.cam.join");
        assert_eq!(s.down(1, false, None), "ndd.cam.d.1");
        assert_eq!(s.down(1, true, Some(3)), "ndd.cam.r.1.3");
        assert_eq!(s.up(2), "ndd.cam.u.2");
        assert_eq!(s.jetstream(), "NDD_ndd_cam");
        assert_eq!(s.jetstream_subjects(), "ndd.cam.r.>");
        assert_eq!(s.group(1), "ndd_cam_1");
        assert_eq!(s.run_mark(0x2a), "ndd.cam.r.runs.000000000000002a");
        assert_eq!(s.run_marks(), "ndd.cam.r.runs.>");
        assert_eq!(s.run_of_mark(&s.run_mark(u64::MAX)), Some(u64::MAX));
        for other in [
            "ndd.cam.r.runs.2a",
            "ndd.cam.r.runs.00000000000000zz",
            "ndd.cam.r.runs.000000000000002A",
            "ndd.cam.r.runs.+00000000000002a",
            "ndd.cat.r.runs.000000000000002a",
            "ndd.cam.r.1",
        ] {
            assert_eq!(s.run_of_mark(other), None, "{other}");
        }
    }

    #[test]
    fn tokens_that_would_break_subjects_are_refused_by_name() {
        assert_eq!(
            Subjects::new("ndd", "my.cam").unwrap_err(),
            "driver (on the NATS link) = \"my.cam\": '.' cannot be part of a NATS subject token (use letters, digits, - and _)"
        );
        assert!(Subjects::new("a>", "x").is_err());
        assert!(Subjects::new("", "x").is_err());
        assert!(Subjects::new("x", &"y".repeat(65)).is_err());
    }

    #[test]
    fn an_app_sides_user_may_not_touch_inboxes_or_device_subjects() {
        let s = Subjects::new("ndd", "cam").unwrap();
        let app = s.permissions(false, "_INBOX_a1", &["a1_1".into()]).unwrap();
        assert!(!app.allow_responses);
        assert!(app.subscribe.contains(&"_INBOX_a1.>".to_string()));
        for p in app.publish.iter().chain(&app.subscribe) {
            assert!(!p.starts_with("_INBOX") || p == "_INBOX_a1.>", "{p}");
            assert!(
                !p.contains("STREAM.DELETE") && !p.contains("STREAM.PURGE"),
                "{p}"
            );
        }
        assert!(!app
            .publish
            .iter()
            .any(|p| p == "ndd.cam.>" || p.starts_with("ndd.cam.d")));
        // Its own consumer only: nobody else's, no consumer of any name.
        assert!(app
            .publish
            .contains(&"$JS.API.CONSUMER.MSG.NEXT.NDD_ndd_cam.a1_1".to_string()));
        assert!(app
            .publish
            .contains(&"$JS.ACK.NDD_ndd_cam.a1_1.>".to_string()));
        assert!(!app
            .publish
            .iter()
            .any(|p| p.contains("device_") || p.ends_with(".*") || p.ends_with("NDD_ndd_cam.>")));
        let dev = s
            .permissions(true, "_INBOX_d", &["device_2".into()])
            .unwrap();
        assert!(dev.allow_responses);
        assert!(dev.publish.contains(&"ndd.cam.>".to_string()));
        assert!(dev
            .publish
            .contains(&"$JS.API.STREAM.CREATE.NDD_ndd_cam".to_string()));
        assert!(dev
            .publish
            .contains(&"$JS.API.STREAM.PURGE.NDD_ndd_cam".to_string()));
        assert!(dev.to_conf().contains("allow_responses: true"));
        assert!(s.permissions(true, "_INBOX.x", &[]).is_err());
        assert!(s.permissions(false, "_INBOX_a", &["a.>".into()]).is_err());
    }
}
