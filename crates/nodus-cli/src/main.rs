//! `nodus`: serve, supervise and watch Node-style event-loop processes.
//!
//! Subcommands arrive with their issues: `serve` (the clustered static/admin HTTP server),
//! `run` (supervise any program as a cluster) and `top` (a live view). Today the binary reports
//! its version and what it is built with.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nodus",
    version,
    about = "Node.js's process and event-loop model, observable by design"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the runtime's version and features.
    Version,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("nodus {}", env!("CARGO_PKG_VERSION"));
        }
    }
}
