//! The command line: what `mailcluster --help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "mailcluster",
    version,
    about = "Kubernetes-native mail system: SMTP, IMAP and POP3 over PostgreSQL and Redis",
    propagate_version = true
)]
pub struct Cli {
    /// Log filter, e.g. `debug` or `mailcluster_server=trace` (overrides RUST_LOG and log.level).
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the mail server (embedded SQLite and in-process cache unless configured otherwise).
    Serve(ServeArgs),
    /// Apply pending database schema migrations (and add missing --domain's), then exit.
    Migrate(MigrateArgs),
    /// Manage mail accounts.
    User {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Manage the domains the server accepts mail for.
    Domain {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: DomainCommand,
    },
    /// Manage aliases: addresses whose mail goes to one or more accounts.
    Alias {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: AliasCommand,
    },
    /// Manage accounts' Sieve scripts (as ManageSieve clients do).
    Sieve {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: SieveCommand,
    },
    /// Run load scenarios against a server and check them against SLOs
    /// (exit 0 all SLOs met, 3 an SLO missed, 1 the run failed).
    Stress(Box<mailcluster_stress::StressArgs>),
    /// Inspect and manage the outbound queue.
    Queue {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// DKIM signing keys.
    Dkim {
        #[command(subcommand)]
        command: DkimCommand,
    },
    /// Run the Kubernetes operator (in-cluster config or KUBECONFIG).
    Operator(OperatorArgs),
    /// Print the MailCluster CustomResourceDefinition YAML.
    Crd {
        /// Print every CRD of the group: MailCluster, MailDomain and MailAccount.
        #[arg(long)]
        all: bool,
    },
    /// Print every object the operator would apply for a MailCluster file.
    Render {
        /// MailCluster YAML file (`-` for stdin).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the version.
    Version,
}

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "MAILCLUSTER_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of the operator's /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "MAILCLUSTER_OPERATOR_METRICS_ADDR")]
    pub metrics_addr: std::net::SocketAddr,
    /// Run without a leader-election Lease (only with a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Repositories a MailCluster's image may come from, comma-separated
    /// (any tag or digest; an entry ending in `/` allows everything below it).
    /// A MailCluster naming another image gets nothing created or changed.
    #[arg(
        long,
        value_name = "REPOSITORIES",
        default_value = mailcluster_operator::image::DEFAULT_ALLOWED_IMAGES,
        env = "MAILCLUSTER_OPERATOR_ALLOWED_IMAGES"
    )]
    pub allowed_images: String,
    /// Nameservers (IP:PORT, comma-separated) at which MailDomains' DNS records
    /// are checked; default: the system's resolver (in a pod, the cluster's).
    #[arg(
        long,
        value_name = "ADDRESSES",
        value_delimiter = ',',
        env = "MAILCLUSTER_OPERATOR_DNS_NAMESERVERS"
    )]
    pub dns_nameservers: Vec<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Configuration file (TOML, or YAML by extension); MAILCLUSTER_* variables override it.
    #[arg(long, short = 'c', value_name = "FILE", env = "MAILCLUSTER_CONFIG", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// A domain to serve: added when missing, never removed (repeatable). The
    /// operator's migration Job passes the MailCluster's `spec.domains` this way.
    #[arg(long = "domain", value_name = "DOMAIN")]
    pub domains: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the effective configuration (secrets redacted) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create an account; the password is read from stdin (one line) unless a flag gives it.
    Add {
        /// Full address, e.g. alice@example.com (its domain must exist).
        email: String,
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// Delete an account and its mail.
    Del { email: String },
    /// Create accounts from a Dovecot passwd-file or a CSV
    /// (address,password-hash,quota,aliases) with their password hashes
    /// (argon2, bcrypt, SHA-crypt; `{PLAIN}` ones are hashed here), one
    /// transaction per batch. Accounts that exist are left alone; domains not
    /// served yet are added. The whole file is checked first: any bad entry,
    /// and nothing is imported.
    Import {
        file: PathBuf,
        /// `passwd` (Dovecot passwd-file), `csv`, or `auto` by the file's extension.
        #[arg(long, value_enum, default_value = "auto")]
        format: ImportFormat,
        /// Accounts per transaction.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Also write a MailAccount manifest per account into DIR, and the
        /// password Secrets they name into DIR/secrets (seal those before
        /// committing them).
        #[arg(long, value_name = "DIR")]
        emit_manifests: Option<PathBuf>,
        /// The MailCluster the manifests name.
        #[arg(long, default_value = "mail")]
        cluster: String,
        /// The namespace written into the manifests (default: none, kubectl's).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// List accounts, one address per line.
    List {
        /// Only accounts of this domain.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Change an account's password (read like `user add`).
    Passwd {
        email: String,
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// Show an account's storage use and limit, or set its limit: a size such as
    /// 500M or 2G (units of 1024), `default` for its domain's default, or `none`.
    Quota {
        email: String,
        #[arg(value_parser = parse_quota)]
        size: Option<QuotaSetting>,
    },
    /// The addresses an account may send as on submission besides its own, its
    /// aliases' and their subaddresses: full addresses or `@domain` for all of a
    /// domain's, e.g. `user senders add alice@example.com sales@example.com`.
    Senders {
        #[command(subcommand)]
        command: SendersCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum SendersCommand {
    /// Allow the account to send as each ADDRESS.
    Add {
        email: String,
        #[arg(required = true)]
        addresses: Vec<String>,
    },
    /// Withdraw what `senders add` allowed.
    Del {
        email: String,
        #[arg(required = true)]
        addresses: Vec<String>,
    },
    /// List what the account may send as besides its own address: `alias ADDRESS`
    /// and `allowed ADDRESS` lines.
    List { email: String },
}

/// A quota limit as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaSetting {
    /// Octets.
    Limit(u64),
    /// No limit of its own: the domain's default applies (for a domain: none).
    Default,
    /// No limit at all.
    Unlimited,
}

/// `2G`, `500M`, `1024K`, `4096` (octets), `none`, `default`. Units are powers of
/// 1024, as IMAP reports quotas (RFC 9208's STORAGE unit is 1024 octets); a `B`
/// or `iB` after the unit is accepted.
pub fn parse_quota(s: &str) -> Result<QuotaSetting, String> {
    let t = s.trim().to_ascii_uppercase();
    match t.as_str() {
        "NONE" | "UNLIMITED" => return Ok(QuotaSetting::Unlimited),
        "DEFAULT" => return Ok(QuotaSetting::Default),
        _ => {}
    }
    let t = t.strip_suffix("IB").or_else(|| t.strip_suffix('B')).unwrap_or(&t);
    let (digits, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 500M, 2G, none)"))?;
    n.checked_mul(1u64 << shift).map(QuotaSetting::Limit).ok_or_else(|| format!("{s:?} is too large"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    Auto,
    Passwd,
    Csv,
}

#[derive(Debug, Args)]
pub struct PasswordArgs {
    /// Read the password from the first line of FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "password")]
    pub password_file: Option<PathBuf>,
    /// INSECURE: the password is visible to other users (ps) and in shell history;
    /// prefer stdin or --password-file.
    #[arg(long, value_name = "VALUE")]
    pub password: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AliasCommand {
    /// Send mail for ADDRESS (at a local domain, no account's) to each TARGET
    /// account too, e.g. `alias add info@example.com alice@example.com bob@example.com`.
    Add {
        address: String,
        #[arg(required = true)]
        targets: Vec<String>,
    },
    /// Remove TARGET from the alias, or the whole alias without one.
    Del { address: String, target: Option<String> },
    /// List aliases, one `address target` pair per line.
    List {
        /// Only aliases of this domain.
        #[arg(long)]
        domain: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SieveCommand {
    /// Store FILE (`-` for stdin) as the user's script NAME, replacing one of
    /// that name; checked as ManageSieve's PUTSCRIPT checks it.
    Put {
        user: String,
        name: String,
        file: PathBuf,
        /// Make it the active script too.
        #[arg(long)]
        activate: bool,
    },
    /// List the user's scripts, one name per line, the active one followed by ` ACTIVE`.
    List { user: String },
    /// Make NAME the active script, or with --none leave none active.
    Activate {
        user: String,
        #[arg(required_unless_present = "none", conflicts_with = "none")]
        name: Option<String>,
        #[arg(long)]
        none: bool,
    },
    /// Print a script's source.
    Get { user: String, name: String },
    /// Delete a script (not the active one).
    Delete { user: String, name: String },
}

#[derive(Debug, Subcommand)]
pub enum DomainCommand {
    /// Accept mail for a domain.
    Add { domain: String },
    /// Stop accepting mail for a domain (refused while it still has accounts).
    Del { domain: String },
    /// List domains, one per line.
    List,
    /// Show or set the default storage limit of the domain's accounts (those
    /// without one of their own): a size such as 1G, or `none`.
    Quota {
        domain: String,
        #[arg(value_parser = parse_quota)]
        size: Option<QuotaSetting>,
    },
    /// Show or set the account that receives the domain's mail for local parts
    /// that are neither an account nor an alias.
    CatchAll {
        domain: String,
        /// The account; omit to show the current one.
        #[arg(conflicts_with = "none")]
        account: Option<String>,
        /// Refuse unknown local parts again.
        #[arg(long)]
        none: bool,
    },
    /// Show or set the DKIM key kept in the store for the domain; every server
    /// signs the domain's mail with it within seconds (a `[[dkim.keys]]` file
    /// for the domain wins over it).
    Key {
        domain: String,
        #[arg(long, requires = "key_file")]
        selector: Option<String>,
        /// The private key (PEM), as `mailcluster dkim generate` writes it.
        #[arg(long, value_name = "FILE", requires = "selector")]
        key_file: Option<PathBuf>,
        #[arg(long, default_value = "ed25519", value_parser = ["ed25519", "rsa"])]
        algorithm: String,
        /// Stop signing with a stored key.
        #[arg(long, conflicts_with_all = ["selector", "key_file"])]
        none: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Messages waiting for delivery, oldest first.
    List {
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One message: its envelope, every recipient's history and its header section.
    Show {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Try now instead of at the scheduled time.
    Retry {
        /// A queue id; without it, every message.
        id: Option<i64>,
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
    /// Remove a message without delivering it or telling its sender.
    Delete { id: i64 },
}

#[derive(Debug, Subcommand)]
pub enum DkimCommand {
    /// Write a new private key and print the DNS TXT record to publish.
    Generate {
        domain: String,
        #[arg(long, default_value = "mail")]
        selector: String,
        #[arg(long, default_value = "ed25519", value_parser = ["ed25519", "rsa"])]
        algorithm: String,
        /// Where the key goes; default DOMAIN.SELECTOR.key in the current directory.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn password_and_password_file_conflict() {
        let r = Cli::try_parse_from([
            "mailcluster",
            "user",
            "add",
            "a@b",
            "--password",
            "x",
            "--password-file",
            "f",
        ]);
        assert_eq!(r.unwrap_err().kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn quota_sizes() {
        assert_eq!(parse_quota("2G"), Ok(QuotaSetting::Limit(2 << 30)));
        assert_eq!(parse_quota("500m"), Ok(QuotaSetting::Limit(500 << 20)));
        assert_eq!(parse_quota("500MiB"), Ok(QuotaSetting::Limit(500 << 20)));
        assert_eq!(parse_quota("64KB"), Ok(QuotaSetting::Limit(64 << 10)));
        assert_eq!(parse_quota("4096"), Ok(QuotaSetting::Limit(4096)));
        assert_eq!(parse_quota("none"), Ok(QuotaSetting::Unlimited));
        assert_eq!(parse_quota("Default"), Ok(QuotaSetting::Default));
        for bad in ["", "G", "-1M", "1.5G", "lots", "99999999999T"] {
            assert!(parse_quota(bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["mailcluster", "user", "quota", "a@example.com", "1G"]).unwrap();
        let Command::User { command: UserCommand::Quota { size, .. }, .. } = cli.command else {
            panic!("quota")
        };
        assert_eq!(size, Some(QuotaSetting::Limit(1 << 30)));
    }

    #[test]
    fn config_flag_works_before_and_after_the_subcommand() {
        let cli = Cli::try_parse_from(["mailcluster", "user", "--config", "a.toml", "list"]).unwrap();
        let Command::User { config, .. } = cli.command else { panic!("user") };
        assert_eq!(config.config, Some(PathBuf::from("a.toml")));
        let cli = Cli::try_parse_from(["mailcluster", "user", "list", "--config", "b.toml"]).unwrap();
        let Command::User { config, .. } = cli.command else { panic!("user") };
        assert_eq!(config.config, Some(PathBuf::from("b.toml")));
    }
}
