//! Status fields bounded by construction.
//!
//! Every string the operator writes to status has a `maxLength` in the schema; a value over it
//! makes the apiserver refuse the whole status write (`Too long: may not be more than 4096
//! bytes`), so the object would never get a status at all. The operator therefore clips what it
//! writes: a clipped value keeps its head and ends with a marker saying how much was left out.

use std::borrow::Cow;

/// The longest condition message the schema accepts.
pub const MAX_CONDITION_MESSAGE: usize = 4096;
/// The longest `status.lastRetry` the schema accepts.
pub const MAX_LAST_RETRY: usize = 256;

/// `text` cut to at most `max` bytes (so also at most `max` characters), at a character boundary,
/// ending in `… [+N bytes]` when anything was cut.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    // The marker's digits depend on how much is cut; the widest marker bounds them all.
    let widest = marker(text.len());
    let budget = max.saturating_sub(widest.len());
    let mut end = budget.min(text.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    let mut out = String::with_capacity(max);
    out.push_str(&text[..end]);
    out.push_str(&marker(cut));
    if out.len() > max {
        // Only when `max` is smaller than any marker: plain truncation is all that fits.
        let mut end = max;
        while end > 0 && !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    Cow::Owned(out)
}

fn marker(cut: usize) -> String {
    format!("… [+{cut} bytes]")
}

/// Joins `items` with `sep` into at most `max` bytes: whole items while they fit, then
/// `… and N more`. Better than [`clip`] for lists of reasons, because no reason is cut mid-word.
pub fn join_bounded<S: AsRef<str>>(items: &[S], sep: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        let item = item.as_ref();
        let rest = items.len() - i - 1;
        let tail = if rest > 0 {
            format!("{sep}… and {rest} more")
        } else {
            String::new()
        };
        let need = if out.is_empty() { 0 } else { sep.len() } + item.len();
        if out.len() + need + tail.len() <= max {
            if !out.is_empty() {
                out.push_str(sep);
            }
            out.push_str(item);
            continue;
        }
        let more = items.len() - i;
        let suffix = if out.is_empty() {
            // Not even the first item fits whole: clip it, and still say how many follow.
            let note = if more > 1 {
                format!(" (and {} more)", more - 1)
            } else {
                String::new()
            };
            let head = clip(item, max.saturating_sub(note.len()));
            return clip(&format!("{head}{note}"), max).into_owned();
        } else {
            format!("{sep}… and {more} more")
        };
        out.push_str(&suffix);
        return clip(&out, max).into_owned();
    }
    out
}

/// The value recorded in `status.lastRetry` for a retry annotation: the value itself when it
/// fits, otherwise its head and a hash of the whole, so a new long value still differs from
/// the last one and the same long value compares equal.
pub fn retry_marker(value: &str) -> String {
    if value.len() <= MAX_LAST_RETRY {
        return value.to_owned();
    }
    let hash = format!(" #{:016x}", fnv1a(value));
    format!("{}{hash}", clip(value, MAX_LAST_RETRY - hash.len()))
}

/// 64-bit FNV-1a: stable across releases and platforms (std's hasher is neither).
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_is() {
        assert_eq!(clip("hello", 10), "hello");
        assert_eq!(clip("", 0), "");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_within_the_bound() {
        let text = "x".repeat(10_000);
        let c = clip(&text, MAX_CONDITION_MESSAGE);
        assert!(c.len() <= MAX_CONDITION_MESSAGE, "{}", c.len());
        assert!(c.ends_with("bytes]"), "{c}");
        let kept = c.chars().take_while(|&ch| ch == 'x').count();
        assert!(c.contains(&format!("+{} bytes", 10_000 - kept)), "{c}");
    }

    #[test]
    fn multibyte_text_is_cut_at_a_character_boundary() {
        let text = "é".repeat(5_000);
        for max in [0, 1, 2, 3, 15, 16, 17, 100, 4096] {
            let c = clip(&text, max);
            assert!(c.len() <= max, "max {max}: {}", c.len());
        }
    }

    #[test]
    fn joined_reasons_keep_whole_items_and_count_the_rest() {
        let items: Vec<String> = (0..1000).map(|i| format!("job-{i}: no room")).collect();
        let j = join_bounded(&items, "; ", 200);
        assert!(j.len() <= 200, "{}", j.len());
        assert!(j.starts_with("job-0: no room; job-1: no room"));
        assert!(j.contains("more"), "{j}");
        assert_eq!(join_bounded(&["a", "b"], "; ", 100), "a; b");
        let huge = vec!["y".repeat(10_000), "z".into()];
        let j = join_bounded(&huge, "; ", 300);
        assert!(j.len() <= 300 && j.contains("and 1 more"), "{j}");
    }

    #[test]
    fn retry_markers_fit_and_tell_long_values_apart() {
        assert_eq!(retry_marker("1700000000"), "1700000000");
        let a = "a".repeat(100_000);
        let mut b = a.clone();
        b.push('b');
        assert!(retry_marker(&a).len() <= MAX_LAST_RETRY);
        assert_eq!(retry_marker(&a), retry_marker(&a));
        assert_ne!(retry_marker(&a), retry_marker(&b));
    }
}
