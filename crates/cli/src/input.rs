//! Reading the objects a person passes with `-f`: files, directories and `-` (stdin), YAML
//! (several documents per file) or JSON, `kind: List` unwrapped, every document located by its
//! file and position so a problem can be pointed at.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// Largest file read (a Bundle is a few KiB; this bounds a mistake such as a video file).
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Most objects read from all the files of one command.
pub const MAX_OBJECTS: usize = 10_000;

/// One object read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceObject {
    /// `path` or `path#3` (the fourth document of a multi-document file).
    pub origin: String,
    /// The object as JSON.
    pub value: serde_json::Value,
}

impl SourceObject {
    /// `apiVersion`, or empty.
    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }
    /// `kind`, or empty.
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }
    /// `metadata.name`, or empty.
    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }
    /// `metadata.namespace`, if set.
    pub fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }
}

/// Reads every object of `paths`: a file, a directory (its `.yaml`, `.yml` and `.json` files,
/// not recursing, like `kubectl apply -f DIR`), or `-` for standard input.
pub fn read_objects(paths: &[PathBuf]) -> Result<Vec<SourceObject>, CliError> {
    let mut out = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_FILE_BYTES + 1)
                .read_to_string(&mut text)
                .map_err(|source| CliError::Read {
                    path: path.clone(),
                    source,
                })?;
            if text.len() as u64 > MAX_FILE_BYTES {
                return Err(CliError::TooLarge {
                    path: path.clone(),
                    max: MAX_FILE_BYTES,
                });
            }
            out.extend(parse_documents(Path::new("<stdin>"), &text)?);
        } else if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| CliError::Read {
                    path: path.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            files.sort();
            for f in files {
                out.extend(parse_documents(&f, &read_file(&f)?)?);
            }
        } else {
            out.extend(parse_documents(path, &read_file(path)?)?);
        }
        if out.len() > MAX_OBJECTS {
            return Err(CliError::Input(format!(
                "more than {MAX_OBJECTS} objects given; validate them in smaller sets"
            )));
        }
    }
    Ok(out)
}

fn read_file(path: &Path) -> Result<String, CliError> {
    let meta = std::fs::metadata(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(CliError::TooLarge {
            path: path.to_owned(),
            max: MAX_FILE_BYTES,
        });
    }
    let bytes = std::fs::read(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|e| CliError::Parse {
        path: path.to_owned(),
        message: format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })
}

/// Every document of one YAML (or JSON) text, as objects; empty documents are skipped and
/// `kind: List` is unwrapped into its `items`.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<SourceObject>, CliError> {
    let mut out = Vec::new();
    // serde-saphyr reports the line and column of the first problem in the whole stream.
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| CliError::Parse {
            path: path.to_owned(),
            // kubectl's words for the same failure, then the parser's position.
            message: format!(
                "error converting YAML to JSON: not valid YAML (or YAML whose keys are not strings): {e}"
            ),
        })?;
    for (index, value) in docs.into_iter().enumerate() {
        let origin = if index == 0 {
            path.display().to_string()
        } else {
            format!("{}#{index}", path.display())
        };
        if value.is_null() {
            continue;
        }
        if !value.is_object() {
            return Err(CliError::Parse {
                path: path.to_owned(),
                message: format!(
                    "document {} is a {}, not a Kubernetes object",
                    index + 1,
                    json_type(&value)
                ),
            });
        }
        if value["kind"] == "List" {
            let Some(items) = value["items"].as_array() else {
                return Err(CliError::Parse {
                    path: path.to_owned(),
                    message: format!("document {} is a List without items", index + 1),
                });
            };
            for (i, item) in items.iter().enumerate() {
                out.push(SourceObject {
                    origin: format!("{origin}.items[{i}]"),
                    value: item.clone(),
                });
            }
        } else {
            out.push(SourceObject { origin, value });
        }
        if out.len() > MAX_OBJECTS {
            return Err(CliError::Input(format!(
                "{} holds more than {MAX_OBJECTS} objects",
                path.display()
            )));
        }
    }
    Ok(out)
}

/// `object`, `array`, `string`, ... for messages.
pub fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "list",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_split_located_and_lists_unwrapped() {
        let text =
            "apiVersion: v1\nkind: A\n---\n---\nkind: List\nitems:\n  - {kind: B}\n  - {kind: C}\n";
        let objs = parse_documents(Path::new("f.yaml"), text).expect("parses");
        let kinds: Vec<&str> = objs.iter().map(SourceObject::kind).collect();
        assert_eq!(kinds, ["A", "B", "C"]);
        assert_eq!(objs[0].origin, "f.yaml");
        // `#N` counts the stream's non-empty documents from 0.
        assert_eq!(objs[1].origin, "f.yaml#1.items[0]");
    }

    #[test]
    fn malformed_yaml_names_the_file_and_position() {
        let err = parse_documents(Path::new("f.yaml"), "kind: A\n---\nspec: [1, 2\n")
            .expect_err("invalid");
        let msg = err.to_string();
        assert!(
            msg.starts_with("f.yaml: error converting YAML to JSON: not valid YAML"),
            "{msg}"
        );
        assert!(msg.contains("line 3 column 7"), "{msg}");
    }

    #[test]
    fn a_scalar_document_is_not_an_object() {
        let err = parse_documents(Path::new("f.yaml"), "just text\n").expect_err("scalar");
        assert_eq!(
            err.to_string(),
            "f.yaml: document 1 is a string, not a Kubernetes object"
        );
    }

    #[test]
    fn json_is_yaml() {
        let objs = parse_documents(Path::new("f.json"), r#"{"kind": "Bundle"}"#).expect("json");
        assert_eq!(objs[0].kind(), "Bundle");
    }

    #[test]
    fn an_oversized_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("dir");
        let big = dir.path().join("big.yaml");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(MAX_FILE_BYTES + 1).expect("grow");
        let err = read_objects(&[big]).expect_err("too large");
        assert!(
            err.to_string()
                .ends_with("is larger than 4194304 bytes; split it into smaller files"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_is_read_like_kubectl_apply_reads_it() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("b.yaml"), "kind: B\n").expect("write");
        std::fs::write(dir.path().join("a.json"), r#"{"kind": "A"}"#).expect("write");
        std::fs::write(dir.path().join("notes.txt"), "kind: C\n").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/d.yaml"), "kind: D\n").expect("write");
        let objs = read_objects(&[dir.path().to_owned()]).expect("reads");
        let kinds: Vec<&str> = objs.iter().map(SourceObject::kind).collect();
        assert_eq!(kinds, ["A", "B"]);
    }

    #[test]
    fn invalid_utf8_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("bin.yaml");
        std::fs::write(&f, b"kind: A\n\xff\xfe").expect("write");
        let err = read_objects(&[f]).expect_err("not text");
        assert!(
            err.to_string()
                .contains("not UTF-8 text (invalid byte at offset 8)"),
            "{err}"
        );
    }
}
