//! Every setting in the configuration table (docs/configuration.md) starts the real
//! binary: given as its environment variable and as its flag, `flashsale
//! serve --dry-run` (or `worker --dry-run`) accepts it and runs with a
//! value it did not have without it, the same from either source. The
//! table, `--help` and the defaults `--help` shows agree. A setting whose
//! parser and field disagree (a start that panics), or one parsed and then
//! ignored, fails here rather than in production.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");
const TOKEN: &str = "3f9a1c0b7e2d4a6f8b5c1e0d";
const SECRET: &str = "0123456789abcdef0123456789abcdef-hs";

/// What one run printed.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// `flashsale <command> --dry-run <flags>` with exactly `env` as its environment.
fn run(command: &str, env: &[(&str, &str)], flags: &[String]) -> Run {
    let out = Command::new(BIN)
        .arg(command)
        .arg("--dry-run")
        .args(flags)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A setting's trial: a value other than its default, the environment it
/// needs beside it (also given to the run it is compared with), and the
/// command that reads it.
struct Case {
    value: String,
    base: Vec<(&'static str, String)>,
    command: &'static str,
}

fn cases() -> BTreeMap<&'static str, Case> {
    // Every run names its consumer (by default `<hostname>-<pid>`, which
    // differs from run to run).
    let admin = ("ADMIN_TOKEN", TOKEN.to_owned());
    let named = ("CONSUMER_NAME", "w".to_owned());
    let trial = || vec![admin.clone(), named.clone(), ("AUTH", "none".to_owned())];
    let jwt = || {
        vec![
            admin.clone(),
            named.clone(),
            ("JWT_SECRET", SECRET.to_owned()),
        ]
    };
    let case = |value: &str, base: Vec<(&'static str, String)>| Case {
        value: value.to_owned(),
        base,
        command: "serve",
    };
    let mut c = BTreeMap::new();
    for (var, value) in [
        ("REDIS_URL", "redis://10.1.2.3:6380"),
        ("REDIS_CLUSTER_NODES", "127.0.0.1:7000,127.0.0.1:7001"),
        ("REDIS_WAIT_REPLICAS", "1"),
        ("REDIS_KEY_PREFIX", "shop2"),
        ("REDIS_TIMEOUT_MS", "1500"),
        ("REDIS_POOL_SIZE", "3"),
        ("DATABASE_URL", "mysql://app:pw@10.1.2.3:3307/books"),
        ("DB_TIMEOUT_MS", "1200"),
        ("DB_MAX_CONNECTIONS", "7"),
        ("LISTEN_ADDR", "127.0.0.1:9099"),
        ("ADMIN_TOKEN", "9e8d7c6b5a4f3e2d1c0b9a8f"),
        ("ADMIN_ROUTES", "false"),
        ("DASHBOARD_SESSION_SECS", "60"),
        ("HEADER_READ_TIMEOUT_MS", "1500"),
        ("IDLE_TIMEOUT_MS", "30000"),
        ("MAX_CONNECTIONS", "5000"),
        ("MAX_CONNECTIONS_PER_ADDRESS", "0"),
        ("MAX_IN_FLIGHT", "64"),
        ("REQUEST_TIMEOUT_MS", "2500"),
        ("RATE_LIMITS", "false"),
        ("RATE_LIMIT_USER_PER_SEC", "7"),
        ("RATE_LIMIT_USER_BURST", "14"),
        ("RATE_LIMIT_IP_PER_SEC", "300"),
        ("RATE_LIMIT_IP_BURST", "600"),
        ("RATE_LIMIT_LOOKUP_PER_SEC", "20"),
        ("RATE_LIMIT_LOOKUP_BURST", "40"),
        ("RATE_LIMIT_POLL_PER_SEC", "30"),
        ("RATE_LIMIT_POLL_BURST", "60"),
        ("RATE_LIMIT_MAX_KEYS", "5000"),
        ("SOLD_OUT_CACHE_MS", "250"),
        ("LIMIT_CACHE_MS", "700"),
        ("LIMIT_CACHE_ENTRIES", "900"),
        ("UNKNOWN_PRODUCT_CACHE_MS", "300"),
        ("WINDOW_FROM_MEMORY", "false"),
        ("WINDOW_MARGIN_MS", "80"),
        ("WORKERS", "false"),
        ("CONSUMER_NAME", "pod-7"),
        ("BATCH_SIZE", "250"),
        ("BLOCK_MS", "900"),
        ("CLAIM_IDLE_MS", "20000"),
        ("MAX_DELIVERIES", "3"),
        ("STREAM_RETENTION_SECS", "120"),
        ("PAYMENT_TIMEOUT_SECS", "300"),
        ("BOOKS_CHECK_MS", "0"),
        ("RETIRE_CHECK_MS", "0"),
        ("RETIRE_AFTER_SECS", "30"),
        ("RETIRE_GRACE_SECS", "15"),
    ] {
        c.insert(var, case(value, trial()));
    }
    // Read only beside another setting.
    let mut wait = trial();
    wait.push(("REDIS_WAIT_REPLICAS", "1".to_owned()));
    c.insert("REDIS_WAIT_TIMEOUT_MS", case("250", wait));
    // Payments: the currency is read only beside the secrets.
    let whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    c.insert("PAYMENT_WEBHOOK_SECRETS", case(whsec, trial()));
    let mut paid = trial();
    paid.push(("PAYMENT_WEBHOOK_SECRETS", whsec.to_owned()));
    c.insert("SALE_CURRENCY", case("USD", paid));
    // Event delivery: the URL and the secret go together; the rest is
    // read only beside them.
    let hook = (
        "EVENT_WEBHOOK_URL",
        "http://127.0.0.1:9/hook,http://127.0.0.1:10/other".to_owned(),
    );
    let hook_secret = ("EVENT_WEBHOOK_SECRET", whsec.to_owned());
    let mut with_secret = trial();
    with_secret.push(hook_secret.clone());
    c.insert("EVENT_WEBHOOK_URL", case(&hook.1, with_secret));
    let mut with_url = trial();
    with_url.push(hook.clone());
    c.insert("EVENT_WEBHOOK_SECRET", case(whsec, with_url));
    let mut pushing = trial();
    pushing.extend([hook, hook_secret]);
    c.insert("EVENT_WEBHOOK_MAX_ATTEMPTS", case("3", pushing.clone()));
    let ca = format!("{}/tests/fixtures/tls/ca.pem", env!("CARGO_MANIFEST_DIR"));
    c.insert("EVENT_WEBHOOK_CA_FILE", case(&ca, pushing.clone()));
    c.insert("EVENT_WEBHOOK_TIMEOUT_MS", case("800", pushing));
    // Identity: without one of these `serve` refuses to start; with it, it does.
    let unverified = || vec![admin.clone(), named.clone()];
    c.insert("AUTH", case("none", unverified()));
    c.insert("JWT_SECRET", case(SECRET, unverified()));
    c.insert(
        "JWT_PUBLIC_KEY_FILE",
        case(&fixture("ec-public.pem"), unverified()),
    );
    c.insert("JWT_JWKS_FILE", case(&fixture("jwks.json"), unverified()));
    for (var, value) in [
        ("JWT_ALGORITHM", "HS512"),
        ("JWT_ISSUER", "https://login.example"),
        ("JWT_AUDIENCE", "flashsale"),
        ("JWT_LEEWAY_SECS", "5"),
        ("JWT_USER_CLAIM", "uid"),
        ("AUTH_TOKEN_CACHE_SIZE", "10"),
    ] {
        c.insert(var, case(value, jwt()));
    }
    // The gateway mode: each of the pair alone is refused.
    let mut with_proxies = jwt();
    with_proxies.push(("AUTH_TRUSTED_PROXIES", "10.0.0.0/8".to_owned()));
    c.insert("AUTH_USER_HEADER", case("X-User-Id", with_proxies));
    let mut with_header = jwt();
    with_header.push(("AUTH_USER_HEADER", "X-User-Id".to_owned()));
    c.insert(
        "AUTH_TRUSTED_PROXIES",
        case("10.0.0.0/8, 192.168.1.7", with_header),
    );
    // The client address from a header: only with the proxies it is
    // believed from (CLIENT_IP_HEADER alone is refused, below).
    let mut with_ip_proxies = trial();
    with_ip_proxies.push(("CLIENT_IP_TRUSTED_PROXIES", "10.0.0.0/8".to_owned()));
    c.insert("CLIENT_IP_HEADER", case("X-Forwarded-For", with_ip_proxies));
    let mut with_ip_header = trial();
    with_ip_header.push(("CLIENT_IP_HEADER", "X-Forwarded-For".to_owned()));
    c.insert(
        "CLIENT_IP_TRUSTED_PROXIES",
        case("10.0.0.0/8, 192.168.1.7", with_ip_header),
    );
    c.insert(
        "METRICS_ADDR",
        Case {
            value: "127.0.0.1:9100".into(),
            base: vec![named.clone()],
            command: "worker",
        },
    );
    // The logs (environment only): what they say, and how.
    c.insert("RUST_LOG", case("warn", trial()));
    c.insert("LOG_FORMAT", case("json", trial()));
    c
}

/// The configuration table (docs/configuration.md): each row's variables and defaults.
fn readme_rows() -> Vec<(Vec<String>, String)> {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    let table = readme
        .split("## Configuration")
        .nth(1)
        .expect("a Configuration section");
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    table
        .lines()
        .skip_while(|l| !l.starts_with("| variable"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (ticked(cells[1]), cells[2].to_owned())
        })
        .collect()
}

/// `--help`'s settings: environment variable -> (flag, default shown).
fn help(command: &str) -> BTreeMap<String, (String, Option<String>)> {
    let out = Command::new(BIN)
        .args([command, "--help"])
        .env_clear()
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut settings = BTreeMap::new();
    let mut flag = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("--") {
            flag = line.split_whitespace().next().unwrap_or("").to_owned();
        }
        if let Some(rest) = line.split("[env: ").nth(1) {
            let var = rest.split(['=', ']']).next().unwrap_or("").to_owned();
            let default = line
                .split("[default: ")
                .nth(1)
                .and_then(|d| d.split(']').next())
                .map(str::to_owned);
            settings.insert(var, (flag.clone(), default));
        }
    }
    settings
}

#[test]
fn the_readme_table_and_help_list_the_same_settings_and_defaults() {
    let mut helped = help("serve");
    helped.extend(help("worker"));
    let mut documented = BTreeSet::new();
    for (vars, default) in readme_rows() {
        let defaults: Vec<&str> = default.split(", ").collect();
        for (i, var) in vars.iter().enumerate() {
            documented.insert(var.clone());
            let Some((_, Some(shown))) = helped.get(var) else {
                continue;
            };
            let written = defaults.get(i).copied().unwrap_or(&default);
            assert_eq!(
                written.trim_matches('`'),
                shown,
                "{var}: docs/configuration.md says {written}, --help {shown}"
            );
        }
    }
    let helped: BTreeSet<String> = helped.into_keys().collect();
    let env_only: BTreeSet<String> = ["RUST_LOG", "LOG_FORMAT"].map(String::from).into();
    let undocumented: Vec<_> = helped.difference(&documented).collect();
    let unknown: Vec<_> = documented
        .difference(&helped)
        .filter(|v| !env_only.contains(*v))
        .collect();
    assert!(
        undocumented.is_empty(),
        "in --help, not in docs/configuration.md: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "in docs/configuration.md, not in --help: {unknown:?}"
    );
}

#[test]
fn every_documented_setting_starts_the_real_binary_from_env_and_flag() {
    let cases = cases();
    let mut flags = help("serve");
    flags.extend(help("worker"));
    let mut missing = Vec::new();
    for (vars, _) in readme_rows() {
        for var in vars {
            let Some(case) = cases.get(var.as_str()) else {
                missing.push(var);
                continue;
            };
            let base: Vec<(&str, &str)> = case.base.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let without = run(case.command, &base, &[]);
            let mut env = base.clone();
            env.retain(|(k, _)| *k != var);
            env.push((var.as_str(), &case.value));
            let from_env = run(case.command, &env, &[]);
            assert!(from_env.ok, "{var}={}: {}", case.value, from_env.stderr);
            assert_ne!(
                (&from_env.stdout, from_env.ok, log_lines(&from_env)),
                (&without.stdout, without.ok, log_lines(&without)),
                "{var}={} changed nothing",
                case.value
            );
            let Some((flag, _)) = flags.get(&var) else {
                assert!(
                    var == "RUST_LOG" || var == "LOG_FORMAT",
                    "{var} has no flag"
                );
                continue;
            };
            let from_flag = run(case.command, &base, &[format!("{flag}={}", case.value)]);
            assert!(from_flag.ok, "{flag}={}: {}", case.value, from_flag.stderr);
            assert_eq!(from_flag.stdout, from_env.stdout, "{flag} and {var} differ");
        }
    }
    assert!(
        missing.is_empty(),
        "documented settings without a case here: {missing:?}"
    );
}

/// The log lines' shapes (a line per message, whatever its time stamp).
fn log_lines(run: &Run) -> Vec<String> {
    run.stderr
        .lines()
        .map(|l| match l.starts_with('{') {
            true => "json".to_owned(),
            false => l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        })
        .collect()
}

/// Secrets never show in the printout, and a value clap cannot take is
/// refused with a message and a non-zero exit, not a panic.
#[test]
fn the_printout_hides_secrets_and_bad_values_are_refused() {
    let whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let env = [
        ("ADMIN_TOKEN", TOKEN),
        ("JWT_SECRET", SECRET),
        ("DATABASE_URL", "mysql://app:s3cr%40t@db/books"),
        ("REDIS_URL", "redis://:hunter22@cache:6379"),
        ("PAYMENT_WEBHOOK_SECRETS", whsec),
    ];
    let printed = run("serve", &env, &[]);
    assert!(printed.ok, "{}", printed.stderr);
    let key = whsec.trim_start_matches("whsec_");
    for secret in [TOKEN, SECRET, "s3cr%40t", "s3cr@t", "hunter22", key] {
        assert!(!printed.stdout.contains(secret), "{secret} shown");
    }
    assert!(printed.stdout.contains("<secret sha256:"));
    for (var, bad) in [
        ("AUTH_TRUSTED_PROXIES", "10.0.0.0/33"),
        ("CLIENT_IP_TRUSTED_PROXIES", "10.0.0.0/33"),
        // Believed from nobody named.
        ("CLIENT_IP_HEADER", "X-Forwarded-For"),
        ("HEADER_READ_TIMEOUT_MS", "0"),
        ("MAX_CONNECTIONS", "-1"),
        ("REDIS_KEY_PREFIX", "a{b}"),
        // Refused, not clamped into range.
        ("BATCH_SIZE", "0"),
        ("BATCH_SIZE", "6000"),
        ("BLOCK_MS", "0"),
        ("MAX_DELIVERIES", "0"),
        ("REQUEST_TIMEOUT_MS", "0"),
        ("DASHBOARD_SESSION_SECS", "0"),
        ("PAYMENT_WEBHOOK_SECRETS", "hunter2-not-a-whsec"),
        ("PAYMENT_WEBHOOK_SECRETS", "whsec_c2hvcnQ="),
        ("SALE_CURRENCY", "yuan"),
        ("EVENT_WEBHOOK_MAX_ATTEMPTS", "0"),
        ("EVENT_WEBHOOK_CA_FILE", "/nonexistent/ca.pem"),
        // A file with no certificate in it (a key is no CA).
        (
            "EVENT_WEBHOOK_CA_FILE",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/tls/receiver.key"
            ),
        ),
        ("EVENT_WEBHOOK_TIMEOUT_MS", "0"),
    ] {
        let refused = run(
            "serve",
            &[("ADMIN_TOKEN", TOKEN), ("AUTH", "none"), (var, bad)],
            &[],
        );
        assert!(!refused.ok, "{var}={bad} accepted");
        assert!(refused.stderr.contains(var), "{var}: {}", refused.stderr);
        assert!(!refused.stderr.contains("panicked"), "{}", refused.stderr);
    }
}

/// `EVENT_WEBHOOK_URL` names each endpoint once: the same URL twice is one
/// deliverer (two would share its lease as one owner and send at once).
#[test]
fn an_endpoint_given_twice_is_delivered_to_once() {
    let whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let env = |urls| {
        run(
            "worker",
            &[
                ("ADMIN_TOKEN", TOKEN),
                ("CONSUMER_NAME", "w"),
                ("AUTH", "none"),
                ("EVENT_WEBHOOK_SECRET", whsec),
                ("EVENT_WEBHOOK_URL", urls),
            ],
            &[],
        )
    };
    let endpoints = |r: Run| {
        assert!(r.ok, "{}", r.stderr);
        r.stdout.matches("DeliverySettings {").count()
    };
    assert_eq!(
        endpoints(env("http://127.0.0.1:9/a,http://127.0.0.1:9/b")),
        2
    );
    assert_eq!(
        endpoints(env("http://127.0.0.1:9/a,http://127.0.0.1:9/a")),
        1
    );
    for bad in ["http://127.0.0.1:9/a,", "http://127.0.0.1:9/a,ftp://b/c"] {
        assert!(!env(bad).ok, "{bad} accepted");
    }
}

/// `flashsale --version`: the release (the crate's version, as the
/// CHANGELOG names it) and the commit it was built from, as `git` names
/// the checkout's HEAD (when the build had one).
#[test]
fn the_version_names_the_release_and_its_commit() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("the binary runs");
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let expected_start = format!("flashsale {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = printed
        .strip_prefix(&expected_start)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{printed:?}"));
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match (std::env::var("FLASHSALE_COMMIT"), head) {
        (Ok(set), _) if !set.is_empty() => assert_eq!(commit, set),
        (_, Some(head)) => assert_eq!(commit, head, "{printed:?}"),
        _ => assert_eq!(commit, "unknown"),
    }
    // The CHANGELOG has the release (released, or the next one).
    let changelog = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/CHANGELOG.md"))
        .expect("CHANGELOG.md");
    let version = env!("CARGO_PKG_VERSION");
    let named = match version.strip_suffix("-dev") {
        Some(_) => changelog.contains("## [Unreleased]"),
        None => changelog.contains(&format!("## [{version}]")),
    };
    assert!(named, "CHANGELOG.md names {version}");
}
