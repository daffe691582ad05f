//! `ferry generate completions|man DIR` (hidden): shell completions and man pages made from
//! the same clap definition that parses the command line, so they cannot drift from it. A
//! subcommand of the shipped binary rather than a build script or helper binary: the package
//! script runs the binary it packs, and the build stays as it is.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::args::{Cli, GenerateCommand};

pub fn run(command: GenerateCommand) -> Result<ExitCode> {
    match command {
        GenerateCommand::Completions { dir } => completions(&dir)?,
        GenerateCommand::Man { dir } => man(&dir)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn completions(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = Cli::command();
        clap_complete::generate_to(shell, &mut cmd, "ferry", dir)
            .with_context(|| format!("writing {shell} completions into {}", dir.display()))?;
    }
    Ok(())
}

fn man(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // One page per subcommand too (ferry-serve.1, ...): `man ferry-serve` is where the
    // options are; hidden ones (this command) get none.
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))
}
