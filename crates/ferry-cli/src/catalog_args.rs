//! The arguments of the catalog commands (`stat`, `rm`, `mv`, `mkdir`, `meta`, `find`): each
//! names a remote path on a running `ferry serve` and asks it through one control connection.

use clap::{Args, Subcommand};

use crate::args::{AuthArgs, ConnArgs, OutputArgs, WaitArgs};

/// How a catalog command reaches its server: output, token, waits, trust.
#[derive(Args, Debug)]
pub struct ReachArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct StatArgs {
    /// Remote file HOST[:PORT]:PATH; more files of the same server as more HOST[:PORT]:PATH
    /// or /PATH (asked on one connection).
    #[arg(required = true, num_args = 1..)]
    pub remotes: Vec<String>,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct RmArgs {
    /// Remote file, symlink or (with -r) directory HOST[:PORT]:PATH.
    pub remote: String,
    /// Remove a directory and everything in it.
    #[arg(short, long)]
    pub recursive: bool,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct MvArgs {
    /// What to move, HOST[:PORT]:PATH.
    pub from: String,
    /// Where to, on the same server: HOST[:PORT]:PATH or just PATH (into it when it is a
    /// directory).
    pub to: String,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct MkdirArgs {
    /// Remote directory HOST[:PORT]:PATH.
    pub remote: String,
    /// Make missing parents too, and take an existing directory as made.
    #[arg(short, long)]
    pub parents: bool,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Subcommand, Debug)]
pub enum MetaCommand {
    /// Add ATTR=VALUE [UNIT] to a registered file (beside other values of ATTR).
    Set(MetaSetArgs),
    /// Remove ATTR from a file (only its VALUE entry when given).
    Rm(MetaRmArgs),
    /// List a file's metadata.
    Ls(MetaLsArgs),
}

impl MetaCommand {
    pub fn reach(&self) -> &ReachArgs {
        match self {
            Self::Set(a) => &a.reach,
            Self::Rm(a) => &a.reach,
            Self::Ls(a) => &a.reach,
        }
    }
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct MetaSetArgs {
    /// Remote file HOST[:PORT]:PATH.
    pub remote: String,
    pub attr: String,
    pub value: String,
    pub unit: Option<String>,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the result as JSON")))]
pub struct MetaRmArgs {
    /// Remote file HOST[:PORT]:PATH.
    pub remote: String,
    pub attr: String,
    pub value: Option<String>,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the metadata as JSON")))]
pub struct MetaLsArgs {
    /// Remote file HOST[:PORT]:PATH; more files of the same server as more HOST[:PORT]:PATH
    /// or /PATH (asked on one connection).
    #[arg(required = true, num_args = 1..)]
    pub remotes: Vec<String>,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the objects found as JSON")))]
pub struct FindArgs {
    /// Remote directory to look under, HOST[:PORT]:PATH.
    pub remote: String,
    /// A metadata condition: ATTR=VALUE, 'ATTR>N' or 'ATTR<N' (numbers). Repeatable; all must
    /// hold.
    #[arg(long = "meta", value_name = "COND")]
    pub meta: Vec<String>,
    /// Only names (the last path component) matching GLOB: `*` any run, `?` one character.
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only files modified after DATE: YYYY-MM-DD, YYYY-MM-DDTHH:MM:SS (UTC) or @SECONDS.
    #[arg(long, value_name = "DATE")]
    pub newer: Option<String>,
    /// Only files larger than SIZE, e.g. 10M.
    #[arg(long, value_name = "SIZE")]
    pub larger: Option<String>,
    /// At most this many objects; past it the output says more matched.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(ferry_proto::MAX_FIND_LIMIT)))]
    pub limit: u32,
    #[command(flatten)]
    pub reach: ReachArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the counts and problem paths as JSON")))]
pub struct VerifyArgs {
    /// Remote file or directory, HOST[:PORT]:PATH.
    pub remote: String,
    /// Also walk the tree for files the catalog does not know (changed behind ferry's back).
    #[arg(short, long)]
    pub recursive: bool,
    /// Copy a good replica over each bad or missing one (from a --from server, as `ferry cp`
    /// does), verify it again and mark it good. Exit 1 when any could not be repaired.
    #[arg(long)]
    pub repair: bool,
    /// A server holding good replicas under the same paths, HOST[:PORT] (both run with
    /// --third-party); repeatable, tried in order.
    #[arg(long, value_name = "HOST[:PORT]", requires = "repair")]
    pub from: Vec<String>,
    /// Token for the --from servers (else --token, FERRY_TOKEN or the config file's entry
    /// for each host).
    #[arg(long, requires = "repair")]
    pub from_token: Option<String>,
    #[command(flatten)]
    pub reach: ReachArgs,
}
