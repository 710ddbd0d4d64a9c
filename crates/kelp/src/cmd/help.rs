//! `kelp completions` and `kelp man`: shell completions and man pages generated from the same
//! clap definitions as `--help`, so they cannot drift from the commands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Directory to write kelp.1 and one page per subcommand (kelp-osd-tree.1, …) into,
    /// created if missing; without it, kelp(1) is printed to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn completions(a: CompletionArgs, mut cmd: clap::Command) -> Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "kelp", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script)
        .context("writing the completion script")?;
    Ok(ExitCode::SUCCESS)
}

pub fn man(a: ManArgs, cmd: clap::Command) -> Result<ExitCode> {
    match a.dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .context("rendering the man page")?;
            std::io::Write::write_all(&mut std::io::stdout(), &page)
                .context("writing the man page")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            let n = std::fs::read_dir(&dir)?.count();
            eprintln!(
                "{n} man pages in {} (man -l {}/kelp.1)",
                dir.display(),
                dir.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
