//! Reading the tail of a process log for error messages.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How much of a log file is read to find its last lines: enough for dozens of long
/// Go log lines, small enough that a runaway log costs nothing.
const TAIL_BYTES: u64 = 64 * 1024;

/// The last `n` lines of `text`, without a trailing newline.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines.get(start..).unwrap_or_default().join("\n")
}

/// The last `n` lines of the file at `path`; a file that cannot be read yields a note
/// saying so, because this only ever decorates another error.
pub(crate) fn read_tail(path: &Path, n: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) if text.trim().is_empty() => "(log is empty)".to_owned(),
        Ok(text) => tail_lines(&text, n),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// True when a log says a listen address was taken, which a retry with new ports fixes.
pub(crate) fn mentions_port_clash(log: &str) -> bool {
    log.contains("address already in use")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tail_keeps_only_the_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\nd\n", 2), "c\nd");
    }

    #[test]
    fn tail_of_a_short_text_is_the_whole_text() {
        assert_eq!(tail_lines("a\nb", 10), "a\nb");
        assert_eq!(tail_lines("", 3), "");
    }

    #[test]
    fn tail_of_zero_lines_is_empty() {
        assert_eq!(tail_lines("a\nb", 0), "");
    }

    #[test]
    fn unreadable_log_is_described_not_fatal() {
        let text = read_tail(Path::new("/nonexistent/testenv/log"), 5);
        assert!(text.starts_with("(cannot read"), "{text}");
    }

    #[test]
    fn a_log_file_longer_than_the_window_still_yields_its_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.log");
        let body: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, body).unwrap();
        assert_eq!(read_tail(&path, 2), "line 19998\nline 19999");
    }

    #[test]
    fn bind_failures_are_recognised_as_port_clashes() {
        assert!(mentions_port_clash(
            "listen tcp 127.0.0.1:2379: bind: address already in use"
        ));
        assert!(!mentions_port_clash("etcdserver: request timed out"));
    }

    proptest! {
        #[test]
        fn tail_never_has_more_lines_than_asked(text in ".{0,400}", n in 0usize..20) {
            let tail = tail_lines(&text, n);
            prop_assert!(tail.lines().count() <= n);
            prop_assert!(text.ends_with(tail.trim_end_matches('\n')) || tail.is_empty() || text.contains(&tail));
        }
    }
}
