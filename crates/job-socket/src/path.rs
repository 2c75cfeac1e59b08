//! Socket paths: `/instances/<jobId>/<role>`, both components encoded like `encodeURIComponent`.

use crate::consts::INSTANCES_PREFIX;

/// The two names a socket path carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobSocketPath {
    /// The job id.
    pub job_id: String,
    /// The instance key (unique per migration target).
    pub role: String,
}

/// `jobSocketPath(jobId, role)`.
pub fn job_socket_path(job_id: &str, role: &str) -> String {
    let mut out = String::with_capacity(INSTANCES_PREFIX.len() + job_id.len() + role.len() + 1);
    out.push_str(INSTANCES_PREFIX);
    encode_uri_component_into(&mut out, job_id);
    out.push('/');
    encode_uri_component_into(&mut out, role);
    out
}

/// `jobSocketUrl({host, port, jobId, role})`.
pub fn job_socket_url(host: &str, port: u16, job_id: &str, role: &str) -> String {
    format!("ws://{host}:{port}{}", job_socket_path(job_id, role))
}

/// `encodeURIComponent`: everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )` as `%XX` of its UTF-8.
pub fn encode_uri_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    encode_uri_component_into(&mut out, s);
    out
}

fn encode_uri_component_into(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')'
            )
        {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
}

/// `decodeURIComponent`: every `%XX` decoded; `None` (the reference's `URIError`) for a `%` not
/// followed by two hex digits or escapes that do not form valid UTF-8 (`%FF`, `%C3`, `%ED%A0%80`).
pub fn decode_uri_component(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hi = hex(*b.get(i + 1)?)?;
            let lo = hex(*b.get(i + 2)?)?;
            out.push((hi << 4) | lo);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    // Raw characters are whole UTF-8 sequences and never continuation bytes, so validating the
    // whole buffer rejects exactly the escapes JavaScript rejects one character at a time.
    String::from_utf8(out).ok()
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `parseJobSocketPath`: the reference's `^/instances/([^/?#]+)/([^/?#]+)/?(?:[?#].*)?$` then
/// `decodeURIComponent` of both. A query or fragment is ignored (but, as JS's `.` does not match
/// them, it may not contain a line terminator: LF, CR, U+2028, U+2029).
pub fn parse_job_socket_path(path: &str) -> Option<JobSocketPath> {
    let rest = path.strip_prefix(INSTANCES_PREFIX)?;
    let seg_end = |s: &str| s.find(['/', '?', '#']).unwrap_or(s.len());
    let n1 = seg_end(rest);
    let (job, rest) = rest.split_at(n1);
    let rest = rest.strip_prefix('/')?;
    let n2 = seg_end(rest);
    let (role, rest) = rest.split_at(n2);
    if job.is_empty() || role.is_empty() {
        return None;
    }
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    if !rest.is_empty() {
        let tail = rest.strip_prefix(['?', '#'])?;
        if tail.contains(['\n', '\r', '\u{2028}', '\u{2029}']) {
            return None;
        }
    }
    Some(JobSocketPath {
        job_id: decode_uri_component(job)?,
        role: decode_uri_component(role)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Option<(String, String)> {
        parse_job_socket_path(s).map(|p| (p.job_id, p.role))
    }

    #[test]
    fn encoding_matches_encode_uri_component() {
        assert_eq!(
            job_socket_path("a/b c", "é+!~*'()"),
            "/instances/a%2Fb%20c/%C3%A9%2B!~*'()"
        );
        assert_eq!(
            job_socket_url("host.docker.internal", 6797, "j", "r"),
            "ws://host.docker.internal:6797/instances/j/r"
        );
    }

    #[test]
    fn parsing_follows_the_reference_regex() {
        let ok = |a: &str, b: &str| Some((a.to_owned(), b.to_owned()));
        assert_eq!(p("/instances/a/b"), ok("a", "b"));
        assert_eq!(p("/instances/a/b/"), ok("a", "b"));
        assert_eq!(p("/instances/a/b?x=1#y"), ok("a", "b"));
        assert_eq!(p("/instances/a/b/#f"), ok("a", "b"));
        assert_eq!(p("/instances/a%2fb/c+d"), ok("a/b", "c+d"));
        assert_eq!(p("/instances/a/b?x\ny"), None);
        assert_eq!(p("/instances/a/b//"), None);
        assert_eq!(p("/instances//b"), None);
        assert_eq!(p("/instances/a/b/c"), None);
        assert_eq!(p("/instances/a?/b"), None);
        assert_eq!(p("/instances/%FF/b"), None);
        assert_eq!(p("/instances/%/b"), None);
        assert_eq!(p("/instances/%ED%A0%80/b"), None);
        assert_eq!(p("/instances/%F0%9F%98%80/b"), ok("😀", "b"));
    }
}
