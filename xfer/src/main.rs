//! The `xfer` command line: parse the arguments, set up logging and the
//! runtime, run the command ([`cli::run`]) and turn its error into one line
//! and a non-zero exit.

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use cli::args::{Cli, Cmd};

fn main() -> ExitCode {
    keep_freed_memory();
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // The RDMA fallback is a line on stderr only when it was asked about.
    xfer::transport::select::say_fallback(
        !matches!(cli.cmd, Cmd::Serve(_)) && (cli.log.is_some() || transport_given(&matches)),
    );
    let default = match cli.cmd {
        Cmd::Serve(_) => "info",
        _ => "warn",
    };
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| default.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(cli::run(cli.cmd)) {
        Ok(code) => code,
        Err(e) => {
            // Wrapped on a terminal (continuation lines indented), one
            // line otherwise.
            eprintln!(
                "{}",
                xfer_proto::text::wrap(
                    &format!("error: {e:#}"),
                    xfer::util::term::stderr_width(),
                    4
                )
            );
            ExitCode::FAILURE
        }
    }
}

/// `--transport` was given on the command line (not left at its default),
/// in the innermost subcommand.
fn transport_given(m: &clap::ArgMatches) -> bool {
    let mut m = m;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    m.ids().any(|id| id.as_str() == "transport")
        && m.value_source("transport") == Some(clap::parser::ValueSource::CommandLine)
}

/// glibc hands the free top of a heap back to the kernel once it exceeds
/// 128 KiB, in every thread's arena. On the data path that is a madvise
/// per burst of packets and a page fault per 4 KiB when the next burst
/// reuses the memory: a tenth of a receiving node's CPU, measured. Keep up
/// to 64 MiB free per arena instead (the heap then stays at its working
/// size, which a transfer reaches within its first chunks anyway).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator, before any
    // thread but this one exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}
