//! The driver's JetStream stream: what a failed attempt to make or read it means. A cluster
//! that has just started or lost a node answers "temporarily unavailable" (or not at all)
//! until its leaders are elected, which is waited out; anything else does not fix itself and
//! is said with what to change.

/// What to do after a failed attempt to make or read the driver's JetStream stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Try again shortly (JetStream electing its leaders).
    Again,
    /// Give up, saying this hint beside the server's words.
    GiveUp(String),
}

/// Whether the JetStream error `e` (its text) passes by itself: what a cluster electing a
/// stream's leader answers for a few seconds after a node went ("temporarily unavailable", no
/// responders, a request timed out, a publish finding "no stream" for its subject). Anything
/// else (permissions, limits, JetStream not enabled) does not, and is said at once.
pub fn passes(e: &str) -> bool {
    e.contains("temporarily unavailable")
        || e.contains("timed out")
        || e.contains("no responders")
        || e.contains("no stream found")
}

/// What the JetStream error `e` (its text) means for a stream of `replicas` copies reserving
/// `store_mib` MiB; `waited_out`: the time to wait for leaders is over.
pub fn after_failure(e: &str, replicas: u8, store_mib: u64, waited_out: bool) -> Attempt {
    let passing = passes(e) || e.contains("insufficient resources") && replicas > 1;
    if passing && !waited_out {
        return Attempt::Again;
    }
    let replicas_short = e.contains("insufficient resources") || e.contains("replicas");
    Attempt::GiveUp(if e.contains("insufficient storage") {
        format!(
            "the server has less JetStream room left than link.nats.store_mib = {store_mib} reserves (its other streams hold the rest, and it offers at most 75% of its free disk by default): lower store_mib, delete streams no driver uses (nats stream rm), or raise the server's jetstream max_file_store"
        )
    } else if replicas_short && replicas > 1 {
        format!(
            "link.nats.replicas = {replicas} needs a JetStream cluster of at least that many servers; one server keeps one copy: replicas = 1"
        )
    } else {
        "reliable streams need JetStream: start nats-server with -js, or set reliability = \"lossy\"".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_electing_its_leaders_is_waited_out_and_the_rest_named() {
        for e in [
            "jetstream error: JetStream system temporarily unavailable (code 503)",
            "timed out: didn't receive a response",
            "no responders",
        ] {
            assert_eq!(after_failure(e, 1, 256, false), Attempt::Again, "{e}");
        }
        // Three copies on a cluster still starting: waited for; on one server, named.
        let short = "insufficient resources (code 500, error code 10023)";
        assert_eq!(after_failure(short, 3, 256, false), Attempt::Again);
        let Attempt::GiveUp(h) = after_failure(short, 3, 256, true) else {
            panic!("gave up")
        };
        assert!(
            h.starts_with("link.nats.replicas = 3 needs a JetStream cluster"),
            "{h}"
        );
        let Attempt::GiveUp(h) =
            after_failure("insufficient storage resources available", 1, 512, false)
        else {
            panic!("gave up")
        };
        assert!(h.contains("link.nats.store_mib = 512 reserves"), "{h}");
        let Attempt::GiveUp(h) = after_failure("JetStream not enabled for account", 1, 256, false)
        else {
            panic!("gave up")
        };
        assert!(h.contains("start nats-server with -js"), "{h}");
    }

    #[test]
    fn what_a_leader_election_answers_passes_and_the_rest_does_not() {
        for e in [
            "jetstream error: JetStream system temporarily unavailable (code 503)",
            "timed out: didn't receive a response",
            "no responders",
            "marking this run in JetStream (ndd.x.r.runs.1): no stream found for given subject",
        ] {
            assert!(passes(e), "{e}");
        }
        for e in [
            "Permissions Violation for Publish to \"$JS.API.CONSUMER.CREATE\"",
            "maximum consumers limit reached (code 400, error code 10026)",
            "signing this run's mark: no key",
        ] {
            assert!(!passes(e), "{e}");
        }
    }
}
