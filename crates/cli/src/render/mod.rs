//! Turning answers into text for people. Pure: every function takes data and returns a
//! `String`, so the output is pinned by snapshot tests on fixed inputs.

pub mod broken;
pub mod history;
pub mod top;
pub mod trace;
pub mod validate;
pub mod whatif;
pub mod windows;

/// A tree of labelled lines, drawn with box-drawing characters.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    pub label: String,
    pub children: Vec<Tree>,
}

impl Tree {
    pub fn new(label: impl Into<String>) -> Self {
        Tree {
            label: label.into(),
            children: Vec::new(),
        }
    }

    pub fn child(mut self, c: Tree) -> Self {
        self.children.push(c);
        self
    }

    pub fn leaf(mut self, label: impl Into<String>) -> Self {
        self.children.push(Tree::new(label));
        self
    }

    /// The tree as lines: the root flush left, children indented under it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        push_lines(&mut out, "", &self.label);
        render_children(&self.children, "", &mut out);
        out
    }
}

fn render_children(children: &[Tree], prefix: &str, out: &mut String) {
    for (i, c) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, cont) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let mut lines = c.label.lines();
        out.push_str(&format!("{prefix}{branch}{}\n", lines.next().unwrap_or("")));
        // Continuation lines of a multi-line label hang under it.
        let hang = if c.children.is_empty() {
            format!("{prefix}{cont}")
        } else {
            format!("{prefix}{cont}│  ")
        };
        for l in lines {
            out.push_str(&format!("{hang}{l}\n"));
        }
        render_children(&c.children, &format!("{prefix}{cont}"), out);
    }
}

fn push_lines(out: &mut String, prefix: &str, text: &str) {
    for l in text.lines() {
        out.push_str(prefix);
        out.push_str(l);
        out.push('\n');
    }
}

/// A table with a header row, columns padded to their widest cell (in characters).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 3;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// `███████░░░  70%`: a fraction (clamped to 0..1) as a ten-cell bar and a percentage.
pub fn bar(used: f64, total: f64) -> String {
    let fraction = if total > 0.0 && used.is_finite() {
        (used / total).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let filled = (fraction * 10.0).round() as usize;
    format!(
        "{}{} {:>3}%",
        "█".repeat(filled),
        "░".repeat(10 - filled),
        (fraction * 100.0).round() as u32
    )
}

/// A whole number without a trailing `.0`; otherwise up to two decimals.
pub fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{:.2}", x)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}

/// `3m`, `2h`, `5d`: the age of `then` at `now`.
pub fn age(then: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) -> String {
    let secs = (now - then).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_draw_branches_and_hang_continuations() {
        let t = Tree::new("root")
            .child(Tree::new("a\nmore about a").leaf("a1"))
            .leaf("b");
        assert_eq!(
            t.render(),
            "root\n├─ a\n│  │  more about a\n│  └─ a1\n└─ b\n"
        );
    }

    #[test]
    fn tables_pad_columns_by_characters() {
        let t = table(
            &["A", "BB"],
            &[
                vec!["█x".into(), "1".into()],
                vec!["yyy".into(), "2".into()],
            ],
        );
        assert_eq!(t, "A     BB\n█x    1\nyyy   2\n");
    }

    #[test]
    fn bars_clamp_and_round() {
        assert_eq!(bar(70.0, 100.0), "███████░░░  70%");
        assert_eq!(bar(5.0, 0.0), "░░░░░░░░░░   0%");
        assert_eq!(bar(150.0, 100.0), "██████████ 100%");
        assert_eq!(bar(f64::NAN, 100.0), "░░░░░░░░░░   0%");
    }

    #[test]
    fn numbers_drop_needless_decimals() {
        assert_eq!(num(8.0), "8");
        assert_eq!(num(8.5), "8.5");
        assert_eq!(num(1.0 / 3.0), "0.33");
    }
}
