//! `cachalot capture-sim`: placeholder for the graph-capture simulation
//! (written in a later change; this module is replaced then).

use clap::Args;

use crate::CliError;

/// Arguments of `capture-sim` (accepted as is until it is implemented).
#[derive(Args, Debug)]
pub struct CaptureSimArgs {
    /// Arguments of the future command.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Runs `capture-sim`: not implemented yet.
pub fn run(_args: &CaptureSimArgs) -> Result<(), CliError> {
    Err(CliError::failure("capture-sim: not implemented yet"))
}
