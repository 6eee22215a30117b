//! Every synopsis in docs/endpoints.md parses, and every catalogue entry is documented.

use ndd_endpoint::{SinkConfig, SourceConfig, SINKS, SOURCES};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/endpoints.md");
    std::fs::read_to_string(path).expect("docs/endpoints.md")
}

#[derive(serde::Deserialize)]
struct One<T> {
    e: T,
}

#[test]
fn every_synopsis_parses_and_describes_as_documented() {
    let doc = doc();
    let mut side = "";
    let (mut sources, mut sinks) = (Vec::new(), Vec::new());
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            side = h;
        }
        let Some(rest) = line.strip_prefix("**Synopsis** `") else {
            continue;
        };
        let table = &rest[..rest.find('`').expect("closing backtick")];
        let toml = format!("e = {table}");
        match side {
            "Sources" => sources.push(toml::from_str::<One<SourceConfig>>(&toml).expect(table).e),
            "Sinks" => sinks.push(toml::from_str::<One<SinkConfig>>(&toml).expect(table).e),
            other => panic!("synopsis outside Sources/Sinks: {other}"),
        }
    }
    let names = |v: Vec<&str>| v.join(",");
    assert_eq!(
        names(sources.iter().map(|s| s.name()).collect()),
        names(SOURCES.iter().map(|i| i.name).collect())
    );
    assert_eq!(
        names(sinks.iter().map(|s| s.name()).collect()),
        names(SINKS.iter().map(|i| i.name).collect())
    );
    for s in &sources {
        assert!(
            doc.contains(&format!("`{}`", s.describe())),
            "{}",
            s.describe()
        );
    }
    for s in &sinks {
        assert!(
            doc.contains(&format!("`{}`", s.describe())),
            "{}",
            s.describe()
        );
    }
}

#[test]
fn the_example_at_the_top_parses() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Example {
        source: SourceConfig,
        sink: SinkConfig,
    }
    let doc = doc();
    let start = doc.find("```toml\n").expect("toml example") + 8;
    let end = start + doc[start..].find("```").expect("end of example");
    let ex: Example = toml::from_str(&doc[start..end]).expect("example parses");
    assert_eq!(ex.source.name(), "synthetic");
    assert_eq!(ex.sink.name(), "check");
}

#[test]
fn every_parameter_is_documented() {
    let doc = doc();
    for info in SOURCES.iter().chain(SINKS) {
        for (key, _, _, _) in info.params {
            assert!(doc.contains(&format!("| `{key}` |")), "{}.{key}", info.name);
        }
    }
}
