//! Validation accepts a regex exactly when Envoy does: every pattern of a hand-written corpus of
//! RE2 edge cases and every `regex` in Istio's own test data (../shared/corpus) is put to
//! `model::validation::validate_regex` and to a real `envoy --mode validate` (a route matching it
//! with `safe_regex`, under the runtime key pilot-agent's bootstrap sets,
//! `re2.max_program_size.error_level` 32768), and the two verdicts must agree.
//!
//! Envoy stops at the first bad regex, so the patterns we accept go into one bootstrap (which must
//! validate) and each pattern we refuse gets its own (which must not).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures::future::join_all;
use serde_json::{Value, json};
use test_support::envoy;

/// RE2 edge cases, each with why it is here.
const EDGE_CASES: &[&str] = &[
    "/a{1000}",                                                         // the largest repetition RE2 takes
    "/a{1001}",                  // the issue's probe: passed our old validation, NACKed by Envoy
    "a{1001,}",                  //
    "a{2,1}",                    //
    "x{,3}",                     // a literal in RE2
    r"\Q.*+?\E",                 // RE2 quoting, refused by Rust's regex
    r"/api/\Q(v1)\E/.*",         //
    r"\Qunterminated",           //
    "(?i)foo|bar",               //
    "(?i)(?-i:a)b",              //
    "(?s).(?m)^a$(?U)a*",        //
    "(?x) a b",                  // no extended mode in RE2
    "[[:alpha:]][[:^digit:]]+",  //
    "[[:word:]]",                //
    "[[:nonsense:]]",            //
    r"\pL+\p{Greek}\PN\p{^Han}", //
    r"\p{Nonsense}",             //
    "(?P<v>[0-9]+)",             //
    "(?<v>[0-9]+)",              // RE2 since 2023, so Envoy's
    "(?P<v>a)(?P<v>b)",          // duplicate name
    "(?P<>a)",                   //
    "(?P<1a>x)",                 //
    "(?P<é>x)",                  //
    "[é-ü]",                     //
    r"\p{Kawi}",                 // a script of Unicode 15
    "(?=a)",                     // lookahead
    "(?!a)b",                    //
    "(?<=a)b",                   // lookbehind
    "(?<!a)b",                   //
    r"(a)\1",                    // backreference
    r"(a)\\1",                   // a backslash and a 1
    "a++",                       // possessive
    "a*?b+?c??",                 // lazy
    "**",                        //
    "a|*",                       //
    "x{2}{3}",                   //
    "[",                         //
    "(",                         //
    ")",                         //
    "[]a]",                      //
    "[^]a]",                     //
    "[z-a]",                     //
    r"[a-\d]",                   //
    r"\",                        //
    r"\C",                       //
    r"\z\A\b\B",                 //
    r"\Z",                       //
    r"\8",                       //
    r"\x{FF}",                   // Envoy parses patterns as Latin-1...
    r"\x{100}",                  // ...so this is out of range
    r"\x{10FFFF}",               //
    r"\x{110000}",               //
    r"\x4",                      //
    r"\u0041",                   //
    "é+ü*",                      //
    "a\u{0}b",                   // a NUL inside
    "((((((((((a))))))))))",     //
    ".{1000}",                   // 8004 instructions: over Envoy's default 100, under 32768
    "(abcdefghijklmnopqrstuvwxyz0123456789){1000}", // 38004 instructions: over 32768
    r"\pL{1000}",                // a class repeated: Latin-1 keeps it small
    "^/api/v[0-9]+/.*$",         //
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", //
];

/// `<workspace>/../shared/corpus`; fails the test when it is missing.
fn corpus_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
    assert!(
        root.is_dir(),
        "{} is missing (the tests read Istio's test data from the shared/ directory beside the project, ../shared)",
        root.display()
    );
    root
}

/// Every string under a `regex` key in the YAML and JSON files below `root`.
fn corpus_regexes(root: &Path) -> anyhow::Result<(Vec<String>, usize)> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
                files.push(path);
            }
        }
    }
    let mut found = Vec::new();
    let mut parsed = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        if !text.contains("regex") {
            continue;
        }
        let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map(|v| vec![v]).unwrap_or_default()
        } else {
            serde_saphyr::from_multiple(&text).unwrap_or_default()
        };
        if docs.is_empty() {
            // Templates and deliberately broken inputs: their regexes are read off the lines.
            found.extend(text.lines().filter_map(line_regex));
            continue;
        }
        parsed += 1;
        for doc in &docs {
            collect(doc, &mut found);
        }
    }
    found.sort();
    found.dedup();
    Ok((found, parsed))
}

fn collect(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("regex", Value::String(s)) => out.push(s.clone()),
                    _ => collect(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
        _ => {}
    }
}

/// `regex: <plain scalar>` on one line of a file that does not parse.
fn line_regex(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("regex:")?.trim();
    (!rest.is_empty() && !rest.starts_with(['"', '\'', '{', '|', '>'])).then(|| rest.to_owned())
}

fn bootstrap(patterns: &[&str]) -> Value {
    let routes: Vec<Value> = patterns
        .iter()
        .map(|p| json!({"match": {"safe_regex": {"regex": p}}, "direct_response": {"status": 200}}))
        .collect();
    json!({
        "node": {"id": "regex-corpus", "cluster": "regex-corpus"},
        "layered_runtime": {"layers": [{"name": "static", "static_layer": {
            "re2.max_program_size.error_level": re2::ISTIO_MAX_PROGRAM_SIZE,
        }}]},
        "static_resources": {"listeners": [{
            "name": "regexes",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "regexes",
                    "route_config": {"name": "regexes", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                },
            }]}],
        }]},
    })
}

#[tokio::test]
async fn validation_accepts_a_regex_exactly_when_envoy_does() -> anyhow::Result<()> {
    envoy::require_envoy_bin();
    let (from_corpus, files) = corpus_regexes(&corpus_root())?;
    assert!(
        from_corpus.len() >= 50 && files >= 20,
        "only {} regexes in {files} files of ../shared/corpus: is the corpus complete?",
        from_corpus.len()
    );
    let mut patterns: Vec<&str> = EDGE_CASES.to_vec();
    patterns.extend(from_corpus.iter().map(String::as_str));
    // Istio's own 1024-character limit comes before RE2; it is tested in model.
    patterns.retain(|p| p.len() <= 1024);
    patterns.sort();
    patterns.dedup();

    let (accepted, refused): (Vec<&str>, Vec<&str>) = patterns
        .iter()
        .partition(|p| model::validation::validate_regex(p).is_ok());
    assert!(
        refused.len() >= 20 && accepted.len() >= 50,
        "{} accepted, {} refused",
        accepted.len(),
        refused.len()
    );

    if let Err(e) = envoy::validate(&bootstrap(&accepted)).await {
        bail!("Envoy refuses a regex that validation accepts: {e:#}");
    }
    let verdicts = join_all(
        refused
            .iter()
            .map(|p| async move { (*p, envoy::validate(&bootstrap(&[p])).await) }),
    )
    .await;
    let wrongly_refused: Vec<&str> = verdicts.iter().filter(|(_, v)| v.is_ok()).map(|(p, _)| *p).collect();
    if !wrongly_refused.is_empty() {
        bail!("validation refuses regexes that Envoy accepts: {wrongly_refused:?}");
    }
    eprintln!(
        "{} regexes ({} from ../shared/corpus): {} accepted by both, {} refused by both",
        patterns.len(),
        from_corpus.len(),
        accepted.len(),
        refused.len()
    );
    Ok(())
}
