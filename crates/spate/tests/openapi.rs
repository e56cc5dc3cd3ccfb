//! The API description at `GET /openapi.json`: it names every route the server answers and no other,
//! and schemathesis (`scripts/schemathesis.sh`, installed in a virtual environment on first use) finds
//! no fault in any app through it: no 5xx, no hang, every answer as described (status, content type,
//! body schema, so every error in its path's shape), invalid requests refused, unknown methods 405.
//! `SPATE_SCHEMATHESIS_EXAMPLES` sets the examples per operation (default 25, and 5 behind keys); the longer run and its
//! figures are in `docs/openapi.md`.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use support::endpoints::{APPS, ENDPOINTS};
use support::{Server, agent, get, new_key};

/// The server's own routes, described under the tag `server`.
const SERVER_ROUTES: [(&str, &str); 6] = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/"),
    ("GET", "/dashboard/app.js"),
    ("GET", "/dashboard/style.css"),
];

fn start_every_app(dir: &std::path::Path, extra: &[&str]) -> Server {
    let kek = dir.join("kek");
    let mut args = vec!["--kek-file", kek.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&dir.join("data"), &args, None)
}

/// Whether `path` is matched by the route `template` (`{name}` matches one segment).
fn matches(template: &str, path: &str) -> bool {
    let (template, path): (Vec<_>, Vec<_>) =
        (template.split('/').collect(), path.split('/').collect());
    template.len() == path.len()
        && (template.iter().zip(&path))
            .all(|(t, p)| t == p || (t.starts_with('{') && t.ends_with('}') && !p.is_empty()))
}

/// The (method, route) pairs `document` describes.
fn described(document: &Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            routes.insert((method.to_uppercase(), path.clone()));
        }
    }
    routes
}

#[test]
fn the_description_names_every_route_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_every_app(dir.path(), &[]);
    let (status, document) = get(&agent(), &format!("{}/openapi.json", server.base));
    assert_eq!(status, 200);
    assert_eq!(document["openapi"], "3.1.0");
    let described = described(&document);
    let mut reached = BTreeSet::new();
    let walked = (ENDPOINTS.iter().map(|&(method, path, _, _)| (method, path)))
        .chain(SERVER_ROUTES.iter().copied());
    for (method, path) in walked {
        // The most specific route wins, as in the router: the one with the fewest `{...}` segments.
        let route = (described.iter())
            .filter(|(m, template)| m == method && matches(template, path))
            .min_by_key(|(_, template)| template.matches('{').count());
        let Some(route) = route else {
            panic!("{method} {path} is served but not described; described: {described:#?}");
        };
        reached.insert(route.clone());
    }
    let undescribed: Vec<_> = described.difference(&reached).collect();
    assert!(
        undescribed.is_empty(),
        "described but not in the list of endpoints (support/endpoints.rs): {undescribed:?}"
    );
    for app in APPS {
        let tagged = (document["paths"].as_object().unwrap().values())
            .flat_map(|item| item.as_object().unwrap().values())
            .filter(|operation| operation["tags"][0] == app)
            .count();
        assert!(tagged > 0, "no operation tagged {app}");
    }
}

/// A body sent as `text/plain` is refused with 415 by the routes that read JSON only, and by no other
/// (ledger, payments, leaderboard and ski read any content type): the description says which.
#[test]
fn a_body_not_sent_as_json_is_refused_with_415_exactly_where_described() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_every_app(dir.path(), &[]);
    let agent = agent();
    let (_, document) = get(&agent, &format!("{}/openapi.json", server.base));
    let mut refused = Vec::new();
    for &(method, path, _, _) in ENDPOINTS {
        let (template, operation) = (document["paths"].as_object().unwrap().iter())
            .filter(|(template, _)| matches(template, path))
            .min_by_key(|(template, _)| template.matches('{').count())
            .map(|(template, item)| (template, &item[method.to_lowercase()]))
            .expect("every endpoint is described");
        if operation["requestBody"].is_null() {
            continue;
        }
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", server.base))
            .header("content-type", "text/plain")
            .body(b"{}".to_vec())
            .unwrap();
        let status = agent.run(request).unwrap().status().as_u16();
        let described = !operation["responses"]["415"].is_null();
        assert!(status < 500, "{method} {path}: {status}");
        assert_eq!(
            status == 415,
            described,
            "{method} {path} ({template}) answered {status}; 415 described: {described}"
        );
        if described {
            refused.push(path);
        }
    }
    assert_eq!(refused.len(), 4, "tally's and fraud's bodies: {refused:?}");
}

/// Examples per operation: `SPATE_SCHEMATHESIS_EXAMPLES`, else `default`.
fn examples(default: u32) -> String {
    std::env::var("SPATE_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| default.to_string())
}

/// Runs `scripts/schemathesis.sh` against `base` for the operations tagged `tag`, with `examples` per
/// operation.
fn schemathesis(base: &str, tag: &str, examples: &str, extra: &[&str]) -> bool {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::process::Command::new("bash")
        .arg(root.join("scripts/schemathesis.sh"))
        .arg(base)
        .args(["--include-tag", tag, "--max-examples", examples])
        .args(["--seed", "1"])
        .args(extra)
        .status()
        .expect("scripts/schemathesis.sh runs")
        .success()
}

#[test]
fn schemathesis_finds_no_fault_in_any_app() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_every_app(dir.path(), &[]);
    let examples = examples(25);
    let failed: Vec<_> = (APPS.iter().chain(&["server"]))
        .filter(|tag| !schemathesis(&server.base, tag, &examples, &[]))
        .collect();
    assert!(failed.is_empty(), "schemathesis found faults in {failed:?}");
}

/// Under `--auth` the description says which key each operation needs, and schemathesis checks that
/// the server refuses requests without it (its `ignored_auth` check) and that every refusal is as
/// described. A few examples per operation: the answers past the gate are the run above's.
#[test]
fn schemathesis_finds_no_fault_behind_api_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let admin = new_key(&keys, "ops", &["admin"]);
    let server = start_every_app(dir.path(), &["--auth", keys.to_str().unwrap()]);
    let (_, document) = get(&agent(), &format!("{}/openapi.json", server.base));
    let scheme = &document["components"]["securitySchemes"]["api_key"];
    assert_eq!(scheme["scheme"], "bearer", "{scheme}");
    let header = format!("Authorization: Bearer {admin}");
    let examples = examples(5);
    let failed: Vec<_> = (APPS.iter().chain(&["server"]))
        .filter(|tag| !schemathesis(&server.base, tag, &examples, &["--header", &header]))
        .collect();
    assert!(failed.is_empty(), "schemathesis found faults in {failed:?}");
}
