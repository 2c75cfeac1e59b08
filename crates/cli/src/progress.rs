//! Live progress for `--wait`: on a terminal, one status line rewritten in place with finished
//! steps printed above it; anywhere else (a pipe, a file, CI), plain lines, one per change, so
//! logs stay readable.

use std::io::Write;
use std::time::{Duration, Instant};

/// Where progress goes, and how.
pub struct Progress {
    out: Box<dyn Write + Send>,
    /// Rewrite a status line in place (a terminal).
    live: bool,
    /// `None` in tests: no elapsed times, so output is deterministic.
    started: Option<Instant>,
    last_status: Option<String>,
    drawn: bool,
}

impl Progress {
    /// Progress on standard error (when stdout carries `-o json`/`yaml`) or standard output,
    /// live when that stream is a terminal.
    pub fn stdio(to_stderr: bool) -> Progress {
        use std::io::IsTerminal;
        let (out, live): (Box<dyn Write + Send>, bool) = if to_stderr {
            (Box::new(std::io::stderr()), std::io::stderr().is_terminal())
        } else {
            (Box::new(std::io::stdout()), std::io::stdout().is_terminal())
        };
        Progress {
            out,
            live,
            started: Some(Instant::now()),
            last_status: None,
            drawn: false,
        }
    }

    /// Progress into `out`, plain or live, without elapsed times (for tests).
    pub fn to_writer(out: Box<dyn Write + Send>, live: bool) -> Progress {
        Progress {
            out,
            live,
            started: None,
            last_status: None,
            drawn: false,
        }
    }

    fn elapsed(&self) -> Option<Duration> {
        self.started.map(|s| s.elapsed())
    }

    fn stamp(&self) -> String {
        self.elapsed()
            .map(|e| format!("[{:>5.1}s] ", e.as_secs_f64()))
            .unwrap_or_default()
    }

    fn clear(&mut self) {
        if self.live && self.drawn {
            let _ = write!(self.out, "\r\x1b[2K");
            self.drawn = false;
        }
    }

    fn redraw(&mut self) {
        if !self.live {
            return;
        }
        if let Some(s) = self.last_status.clone() {
            let stamp = self.stamp();
            let _ = write!(self.out, "\r\x1b[2K{stamp}{s}");
            let _ = self.out.flush();
            self.drawn = true;
        }
    }

    /// A step that finished: a permanent line.
    pub fn event(&mut self, line: &str) {
        self.clear();
        let stamp = self.stamp();
        let _ = writeln!(self.out, "{stamp}{line}");
        self.redraw();
        let _ = self.out.flush();
    }

    /// The current state. Live: rewritten in place. Plain: printed when it changed.
    pub fn status(&mut self, line: &str) {
        if self.last_status.as_deref() == Some(line) {
            // Refresh the elapsed time on a terminal; nothing new for a log.
            self.redraw();
            return;
        }
        self.last_status = Some(line.to_owned());
        if self.live {
            self.redraw();
        } else {
            let stamp = self.stamp();
            let _ = writeln!(self.out, "{stamp}{line}");
            let _ = self.out.flush();
        }
    }

    /// Removes the live line (the final answer is printed after it).
    pub fn finish(&mut self) {
        self.clear();
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Buf {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().map(|v| v.clone()).unwrap_or_default())
                .into_owned()
        }
    }

    #[test]
    fn plain_output_is_one_line_per_change() {
        let buf = Buf::default();
        let mut p = Progress::to_writer(Box::new(buf.clone()), false);
        p.status("phase Pending");
        p.status("phase Pending");
        p.event("entered StartingTarget");
        p.status("phase StartingTarget");
        p.finish();
        assert_eq!(
            buf.text(),
            "phase Pending\nentered StartingTarget\nphase StartingTarget\n"
        );
    }

    #[test]
    fn live_output_rewrites_one_line_and_keeps_events() {
        let buf = Buf::default();
        let mut p = Progress::to_writer(Box::new(buf.clone()), true);
        p.status("phase Pending");
        p.event("entered StartingTarget");
        p.finish();
        assert_eq!(
            buf.text(),
            "\r\x1b[2Kphase Pending\r\x1b[2Kentered StartingTarget\n\r\x1b[2Kphase Pending\r\x1b[2K"
        );
    }
}
