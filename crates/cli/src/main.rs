//! `kubectl-automanager`: see the library's docs and `docs/cli.md`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `__complete` takes the words kubectl passes as they are (flags included), so it is read
    // before the command line is parsed.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let completing = args.first().is_some_and(|a| a == "__complete");
    let cli = if completing {
        None
    } else {
        Some(automanager_cli::Cli::parse())
    };
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
    let Some(cli) = cli else {
        let text = runtime.block_on(automanager_cli::complete::complete(&args[1..]));
        use std::io::Write;
        // A shell that stopped reading has nothing to be told.
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        return ExitCode::SUCCESS;
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
