//! `kubectl-automanager`: see the library's docs and `docs/cli.md`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = automanager_cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(automanager_cli::run(cli)) {
        // A reader that stopped reading (`| head`) got what it wanted.
        Ok(()) | Err(automanager_cli::CliError::OutputClosed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
