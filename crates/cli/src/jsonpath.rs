//! `-o jsonpath=TEMPLATE`: kubectl's JSONPath templates over the plugin's JSON output.
//!
//! The template language is kubectl's (text, `{expression}`, `{range expression}…{end}`,
//! `{"literal"}` with `\n`/`\t`); each expression is evaluated by the `jsonpath-rust` crate
//! after kubectl's spelling is turned into RFC 9535's (`.a.b` → `$.a.b`; inside a range, `.x`
//! and `@.x` are relative to the current item). As kubectl prints them, strings are printed
//! bare, other values as JSON, and several results of one expression separated by spaces.

use jsonpath_rust::JsonPath;
use serde_json::Value;

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Expr(String),
    Range(String, Vec<Node>),
}

impl Template {
    /// Parses a template; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Template, String> {
        let tokens = tokenize(text)?;
        let mut pos = 0;
        let nodes = parse_nodes(&tokens, &mut pos, false)?;
        Ok(Template { nodes })
    }

    /// Renders the template over `data`.
    pub fn render(&self, data: &Value) -> Result<String, String> {
        let mut out = String::new();
        render_nodes(&self.nodes, data, data, &mut out)?;
        Ok(out)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Text(String),
    Action(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find('{') {
            None => {
                tokens.push(Token::Text(rest.to_owned()));
                break;
            }
            Some(start) => {
                if start > 0 {
                    tokens.push(Token::Text(rest[..start].to_owned()));
                }
                let after = &rest[start + 1..];
                let end = closing_brace(after).ok_or_else(|| {
                    format!(
                        "unclosed action in the jsonpath template at {:?}",
                        &rest[start..]
                    )
                })?;
                tokens.push(Token::Action(after[..end].trim().to_owned()));
                rest = &after[end + 1..];
            }
        }
    }
    Ok(tokens)
}

/// The index of the `}` that closes an action, skipping those inside quotes and brackets.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut depth = 0usize;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            '}' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_nodes(tokens: &[Token], pos: &mut usize, in_range: bool) -> Result<Vec<Node>, String> {
    let mut nodes = Vec::new();
    while *pos < tokens.len() {
        let token = tokens[*pos].clone();
        *pos += 1;
        match token {
            Token::Text(t) => nodes.push(Node::Text(t)),
            Token::Action(a) if a == "end" => {
                if in_range {
                    return Ok(nodes);
                }
                return Err("{end} without a {range …} in the jsonpath template".into());
            }
            Token::Action(a) => {
                if let Some(expr) = a.strip_prefix("range ") {
                    let body = parse_nodes(tokens, pos, true)?;
                    nodes.push(Node::Range(expr.trim().to_owned(), body));
                } else if let Some(lit) = literal(&a) {
                    nodes.push(Node::Text(lit));
                } else if a.is_empty() {
                    return Err("an empty {} in the jsonpath template".into());
                } else {
                    check_expression(&a)?;
                    nodes.push(Node::Expr(a));
                }
            }
        }
    }
    if in_range {
        return Err("a {range …} without its {end} in the jsonpath template".into());
    }
    Ok(nodes)
}

/// `"text"` with kubectl's escapes, as a template action.
fn literal(action: &str) -> Option<String> {
    let inner = action.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// kubectl's spelling to RFC 9535's: `.a` / `a` → `$.a`, `@.a` stays relative.
fn to_rfc(expr: &str) -> (String, bool) {
    let e = expr.trim();
    if let Some(rest) = e.strip_prefix('@') {
        return (format!("${rest}"), true);
    }
    if e.starts_with('$') {
        return (e.to_owned(), false);
    }
    if e.starts_with('.') || e.starts_with('[') {
        return (format!("${e}"), false);
    }
    (format!("$.{e}"), false)
}

fn check_expression(expr: &str) -> Result<(), String> {
    let (path, _) = to_rfc(expr);
    Value::Null
        .query(&path)
        .map(|_| ())
        .map_err(|e| format!("jsonpath expression {{{expr}}}: {e}"))
}

fn query<'a>(
    expr: &str,
    root: &'a Value,
    current: &'a Value,
    in_range: bool,
) -> Result<Vec<&'a Value>, String> {
    let (path, relative) = to_rfc(expr);
    // Inside a range, `.x` (like `@.x`) reads the current item, as kubectl does.
    let base = if relative || in_range { current } else { root };
    base.query(&path)
        .map_err(|e| format!("jsonpath expression {{{expr}}}: {e}"))
}

fn render_nodes(
    nodes: &[Node],
    root: &Value,
    current: &Value,
    out: &mut String,
) -> Result<(), String> {
    let in_range = !std::ptr::eq(root, current);
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Expr(e) => {
                let values = query(e, root, current, in_range)?;
                let parts: Vec<String> = values.into_iter().map(print).collect();
                out.push_str(&parts.join(" "));
            }
            Node::Range(e, body) => {
                for item in query(e, root, current, in_range)? {
                    render_nodes(body, root, item, out)?;
                }
            }
        }
    }
    Ok(())
}

fn print(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, data: &Value) -> String {
        Template::parse(template)
            .and_then(|t| t.render(data))
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn fields_lists_and_literals_render_as_kubectl_prints_them() {
        let data = json!({"metadata": {"name": "news"}, "items": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]});
        assert_eq!(render("{.metadata.name}", &data), "news");
        assert_eq!(render("{.items[*].name}", &data), "a b");
        assert_eq!(render("{.items[0]}", &data), r#"{"n":1,"name":"a"}"#);
        assert_eq!(
            render("name={.metadata.name}{\"\\n\"}", &data),
            "name=news\n"
        );
        assert_eq!(
            render("{range .items[*]}{.name}={@.n}{\"\\t\"}{end}", &data),
            "a=1\tb=2\t"
        );
        assert_eq!(render("{.nosuch}", &data), "");
    }

    #[test]
    fn a_broken_template_is_refused_with_the_reason() {
        assert!(Template::parse("{.a").is_err());
        assert!(Template::parse("{range .items[*]}{.a}").is_err());
        assert!(Template::parse("{end}").is_err());
        assert!(Template::parse("{}").is_err());
        assert!(Template::parse("{.a[?(@.b==}").is_err());
    }
}
