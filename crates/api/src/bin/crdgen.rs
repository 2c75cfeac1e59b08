//! Writes every AutoManager CRD to `crds/<plural>.yaml` (or the directory given as the first
//! argument), or with `--stdout` prints them as one multi-document stream, or with
//! `--reference [FILE]` writes the Markdown CRD reference (default `docs/reference/crds.md`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    let rendered = match automanager_api::crd::render_all() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if arg.as_deref() == Some("--reference") {
        // `crdgen --reference FILE`: the Markdown CRD reference (docs/reference/crds.md).
        let path = PathBuf::from(
            std::env::args()
                .nth(2)
                .unwrap_or_else(|| "docs/reference/crds.md".into()),
        );
        if let Some(parent) = path.parent()
            && let Err(e) = std::fs::create_dir_all(parent)
        {
            eprintln!("crdgen: creating {}: {e}", parent.display());
            return ExitCode::FAILURE;
        }
        if let Err(e) = std::fs::write(&path, automanager_api::reference::markdown()) {
            eprintln!("crdgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("crdgen: wrote {}", path.display());
        return ExitCode::SUCCESS;
    }
    if arg.as_deref() == Some("--stdout") {
        for (_, yaml) in &rendered {
            println!("---\n{yaml}");
        }
        return ExitCode::SUCCESS;
    }
    let dir = PathBuf::from(arg.unwrap_or_else(|| "crds".to_string()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("crdgen: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for (name, yaml) in rendered {
        let path = dir.join(&name);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("crdgen: wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
