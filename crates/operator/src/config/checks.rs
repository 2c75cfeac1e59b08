//! What the schema cannot say: the shapes behind our `format`s (each check words its own
//! error), and the checks on the typed settings (files that must exist, contradictions).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use automanager_policy::calendar::Recurrence;

use super::{ConfigError, FileChecks, ManagerConfig, OperatorConfig, err};

/// A check of one string: its error message and, maybe, a suggested spelling.
pub(crate) type Check = fn(&str) -> Result<(), (String, Option<String>)>;

fn plain(message: impl Into<String>) -> (String, Option<String>) {
    (message.into(), None)
}

fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// RFC 1123 label: 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A namespace name.
pub(crate) fn dns_label(s: &str) -> Result<(), (String, Option<String>)> {
    if is_dns_label(s) {
        return Ok(());
    }
    Err(plain(format!(
        "`{}` is not a valid name: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit",
        shown(s)
    )))
}

/// RFC 1123 subdomain (an object or host name): labels joined by '.', at most 253 characters.
pub(crate) fn dns_subdomain(s: &str) -> Result<(), (String, Option<String>)> {
    if s.len() <= 253 && s.split('.').all(is_dns_label) {
        return Ok(());
    }
    Err(plain(format!(
        "`{}` is not a valid name: lowercase letters, digits, '-' and '.', at most 253 characters",
        shown(s)
    )))
}

pub(crate) fn ip_and_port(s: &str) -> Result<(), (String, Option<String>)> {
    s.parse::<SocketAddr>().map(drop).map_err(|_| {
        plain(format!(
            "must be an IP address and port, e.g. 127.0.0.1:8080 or [::]:8080, not `{}`",
            shown(s)
        ))
    })
}

pub(crate) fn file_path(s: &str) -> Result<(), (String, Option<String>)> {
    if s.trim().is_empty() {
        return Err(plain("must not be empty"));
    }
    Ok(())
}

/// The fields of a disruption window, each read by the calendar the operator applies, with a
/// fixed value for the other two.
pub(crate) fn cron_schedule(s: &str) -> Result<(), (String, Option<String>)> {
    Recurrence::parse(s, "1h", "UTC")
        .map(drop)
        .map_err(|e| plain(e.to_string()))
}

pub(crate) fn window_duration(s: &str) -> Result<(), (String, Option<String>)> {
    Recurrence::parse("@daily", s, "UTC")
        .map(drop)
        .map_err(|e| {
            plain(format!(
                "{e} (a Go duration such as 2h or 5h30m, 1m to 744h)"
            ))
        })
}

pub(crate) fn time_zone(s: &str) -> Result<(), (String, Option<String>)> {
    Recurrence::parse("@daily", "1h", s)
        .map(drop)
        .map_err(|e| plain(e.to_string()))
}

pub(crate) fn manager_url(s: &str) -> Result<(), (String, Option<String>)> {
    parse_manager_url(s).map(drop)
}

/// Whether Manager's URL asks for TLS: `None` for a bare `host:port`, which says nothing
/// (the TLS settings decide), or for a URL that is not valid.
fn is_https(url: &str) -> Option<bool> {
    parse_manager_url(url).ok().flatten()
}

/// `http(s)://host:port` with an optional trailing `/`, or a bare `host:port` (the TypeScript
/// library's form, a gRPC target); host a DNS name, IPv4 or `[IPv6]`. Answers whether it is
/// `https` (`None`: no scheme).
fn parse_manager_url(url: &str) -> Result<Option<bool>, (String, Option<String>)> {
    if url.trim().is_empty() {
        return Err(plain(
            "is required: Manager's gRPC address, e.g. http://127.0.0.1:6789",
        ));
    }
    if !url.contains("://") {
        // Checked as the URL it resolves to; the scheme is the TLS settings' to decide.
        return parse_with_scheme(&format!("http://{url}")).map(|_| None);
    }
    parse_with_scheme(url).map(Some)
}

fn parse_with_scheme(url: &str) -> Result<bool, (String, Option<String>)> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| plain(format!("is not a valid URL ({e})")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(plain("must use http:// or https://")),
    };
    // http::Uri drops a fragment silently, so look for one in the text.
    if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() || url.contains('#') {
        return Err(plain(
            "must be just scheme, host and port (no path, query or fragment)",
        ));
    }
    let Some(authority) = uri.authority() else {
        return Err(plain(
            "must name a host and port, e.g. http://127.0.0.1:6789",
        ));
    };
    if authority.as_str().contains('@') {
        return Err(plain("must not contain credentials; use manager.tokenFile"));
    }
    match authority.port_u16() {
        None => return Err(plain("must name a port, e.g. http://127.0.0.1:6789")),
        Some(0) => return Err(plain("has an invalid port (1 to 65535)")),
        Some(_) => {}
    }
    let host = authority.host();
    let valid_host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok(),
        None => {
            host.parse::<Ipv4Addr>().is_ok()
                || (!host.is_empty() && dns_subdomain(&host.to_ascii_lowercase()).is_ok())
        }
    };
    if !valid_host {
        return Err(plain("has an invalid host name"));
    }
    Ok(https)
}

fn check_file(errors: &mut Vec<ConfigError>, path: &str, file: &Path) {
    match std::fs::metadata(file) {
        Ok(m) if m.is_file() => {}
        Ok(_) => errors.push(err(
            path,
            format!("{} is not a regular file", file.display()),
        )),
        Err(e) => errors.push(err(path, format!("cannot read {}: {e}", file.display()))),
    }
}

/// The checks on typed settings: Manager's URL is given, TLS matches its scheme, files exist,
/// the lease is renewed before it lapses.
pub(crate) fn typed(c: &OperatorConfig, files: FileChecks) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    manager_connection(&mut errors, &c.manager, files);
    between_settings(&mut errors, c);
    errors
}

/// Manager's URL, TLS and token: given, consistent with each other, and readable.
fn manager_connection(errors: &mut Vec<ConfigError>, m: &ManagerConfig, files: FileChecks) {
    if m.url.trim().is_empty() {
        errors.push(err(
            "manager.url",
            "is required: Manager's gRPC address, e.g. http://127.0.0.1:6789",
        ));
    }
    match (&m.tls, is_https(&m.url)) {
        (Some(_), Some(false)) => errors.push(err(
            "manager.tls",
            "is set but manager.url uses http://; use https:// (or a bare host:port) to connect with TLS",
        )),
        (None, Some(true)) => errors.push(err(
            "manager.tls.caFile",
            "is required with an https:// URL: the client trusts only this CA (no system roots are built in)",
        )),
        _ => {}
    }
    if let Some(tls) = &m.tls {
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => errors.push(err(
                "manager.tls.keyFile",
                "is required with manager.tls.certFile (mutual TLS needs both)",
            )),
            (None, Some(_)) => errors.push(err(
                "manager.tls.certFile",
                "is required with manager.tls.keyFile (mutual TLS needs both)",
            )),
            _ => {}
        }
    }
    if files == FileChecks::Check {
        let tls = m.tls.as_ref();
        let named = [
            ("manager.tokenFile", m.token_file.as_deref()),
            ("manager.tls.caFile", tls.map(|t| t.ca_file.as_path())),
            (
                "manager.tls.certFile",
                tls.and_then(|t| t.cert_file.as_deref()),
            ),
            (
                "manager.tls.keyFile",
                tls.and_then(|t| t.key_file.as_deref()),
            ),
        ];
        for (path, file) in named {
            if let Some(file) = file {
                check_file(errors, path, file);
            }
        }
        // The token as the operator will send it, when the file is there to read.
        if let Some(file) = m.token_file.as_deref().filter(|f| f.is_file())
            && let Err(problem) = super::read_token(file)
        {
            errors.push(err(
                "manager.tokenFile",
                format!("{}: {problem}", file.display()),
            ));
        }
    }
}

/// Settings that are each valid alone but contradict another setting.
fn between_settings(errors: &mut Vec<ConfigError>, c: &OperatorConfig) {
    if let Some(debug) = c.http.debug_bind_address
        && same_listener(debug, c.http.bind_address)
    {
        errors.push(err(
            "http.debugBindAddress",
            format!(
                "must use another port than http.bindAddress ({}): the debugging API has a port of its own, so exposing probes and metrics never exposes it",
                c.http.bind_address
            ),
        ));
    }
    if c.migration.max_parallel_per_node > c.migration.max_parallel {
        errors.push(err(
            "migration.maxParallelPerNode",
            format!(
                "must not exceed migration.maxParallel ({}): no node can take part in more migrations than run in the whole fleet",
                c.migration.max_parallel
            ),
        ));
    }
    if c.manager.idle_timeout <= c.manager.heartbeat_interval {
        errors.push(err(
            "manager.idleTimeout",
            format!(
                "must be longer than manager.heartbeatInterval ({}), or every quiet Watch stream is cut",
                super::duration::show(c.manager.heartbeat_interval)
            ),
        ));
    }
    let nh = &c.node_health;
    if nh.flap_max_hold < nh.rejection_window {
        errors.push(err(
            "nodeHealth.flapMaxHold",
            format!(
                "must be at least nodeHealth.rejectionWindow ({}): the first hold-out of an unhealthy node is the rejection window",
                super::duration::show(nh.rejection_window)
            ),
        ));
    }
    if c.bands.bronze.preempt {
        errors.push(err(
            "bands.bronze.preempt",
            "must be false: preemption stops bronze jobs to recover gold or silver ones, so bronze has nothing below it to preempt",
        ));
    }
    let le = &c.leader_election;
    if let Some(renew) = le.renew_every
        && renew.as_secs() + 2 > le.lease_duration.as_secs()
    {
        errors.push(err(
            "leaderElection.renewEvery",
            format!(
                "must be at least 2s shorter than leaderElection.leaseDuration ({}s), so the holder renews before the lease lapses",
                le.lease_duration.as_secs()
            ),
        ));
    }
}

/// Whether two listen addresses would collide: the same port on the same address, or on any
/// address when either is unspecified (`0.0.0.0`, `[::]`). Port 0 asks for any free port, so it
/// never collides.
fn same_listener(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manager_urls_must_be_scheme_host_and_port() {
        for good in [
            "http://127.0.0.1:6789",
            "http://manager:1/",
            "http://[::1]:6789",
            "http://a.b-c.example:65535",
            "HTTP://Manager.Example:1",
        ] {
            assert!(parse_manager_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "ftp://h:1",
            "http://h",
            "http://h:0",
            "http://h:70000",
            "http://h:x",
            "http://h:1/path",
            "http://h:1/?q",
            "http://h:1#f",
            "http://user@h:1",
            "http://[::1:6789",
            "http://[zz]:1",
            "http://bad_host:1",
            "http://:1",
        ] {
            assert!(parse_manager_url(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_manager_url("https://[::1]:443"), Ok(Some(true)));
        assert_eq!(parse_manager_url("http://h:1"), Ok(Some(false)));
    }

    /// The TypeScript library's `url: "manager.example.com:6789"`: a gRPC target with no
    /// scheme, accepted; whether it is TLS is left to the TLS settings.
    #[test]
    fn a_bare_host_and_port_is_accepted_and_says_nothing_of_tls() {
        for good in [
            "manager.example.com:6789",
            "10.0.0.7:6789",
            "[::1]:6789",
            "m:1/",
        ] {
            assert_eq!(parse_manager_url(good), Ok(None), "{good}");
        }
        for bad in [
            "manager.example.com",
            "manager:0",
            "manager:6789/path",
            "user@manager:6789",
            "bad_host:1",
            ":6789",
        ] {
            assert!(parse_manager_url(bad).is_err(), "{bad}");
        }
        let (m, _) = parse_manager_url("manager.example.com")
            .err()
            .unwrap_or_default();
        assert!(m.contains("port"), "{m}");
    }

    #[test]
    fn names_follow_rfc_1123() {
        assert!(dns_label("video-1").is_ok());
        for bad in ["", "-a", "a-", "Video", "a.b", &"a".repeat(64)] {
            assert!(dns_label(bad).is_err(), "{bad}");
        }
        assert!(dns_subdomain("am.lock-1").is_ok());
        for bad in ["", "a..b", ".a", "A", &format!("{}.a", "a".repeat(253))] {
            assert!(dns_subdomain(bad).is_err(), "{bad}");
        }
        assert!(ip_and_port("[::]:81").is_ok());
        assert!(ip_and_port("localhost:8080").is_err());
        assert!(file_path(" ").is_err());
    }
}
