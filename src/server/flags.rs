//! The manager's flags (ref §6.1 names and defaults; CONTRACT "Manager").
//!
//! Every flag also reads `CAPTF_<FLAG>` from the environment. Boolean flags
//! take `--flag`, `--flag=true` and `--flag=false` (Go's spelling, so a `=`
//! is required for the value), and durations use Go's syntax (`10m0s`, `30s`,
//! `1h`), so that the Go manager's manifests keep working.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

use crate::error::{Categorized, Category};
use crate::image_ref::ImageRef;

/// The flags of `captf-manager`.
#[derive(Clone, Debug, Parser)]
#[command(name = "captf-manager", version, about)]
pub struct Flags {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Backups of the state kept per object; 0 takes none (existing ones stay restorable).
    #[arg(long, env = "CAPTF_STATE_BACKUPS", default_value_t = 5)]
    pub state_backups: u32,

    /// Serialize a cluster's apply, destroy and restore against its machines' and pools'
    /// through a per-Cluster write Lease.
    #[arg(long, env = "CAPTF_CLUSTER_OPERATION_GATE", default_value = "true",
          action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub cluster_operation_gate: bool,

    /// Init-container image that contains /runner; empty means $CAPTF_MANAGER_IMAGE, else the manager's own image.
    #[arg(long, env = "CAPTF_RUNNER_IMAGE", default_value = "")]
    pub runner_image: String,

    /// Watch one namespace only; empty watches all (the identity kind is always cluster-wide).
    #[arg(long, env = "CAPTF_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Reconcile only objects labeled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, env = "CAPTF_WATCH_FILTER", default_value = "")]
    pub watch_filter: String,

    /// Informer resync period; also the orphan-sweep period.
    #[arg(long, env = "CAPTF_SYNC_PERIOD", default_value = "10m0s")]
    pub sync_period: GoDuration,

    /// Run the reconcilers only while holding the Lease controller-leader-election-captf.
    #[arg(long, env = "CAPTF_LEADER_ELECT", default_value = "false",
          action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_elect: bool,

    #[arg(long, env = "CAPTF_LEADER_ELECT_LEASE_DURATION", default_value = "15s")]
    pub leader_elect_lease_duration: GoDuration,

    #[arg(long, env = "CAPTF_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s")]
    pub leader_elect_renew_deadline: GoDuration,

    #[arg(long, env = "CAPTF_LEADER_ELECT_RETRY_PERIOD", default_value = "2s")]
    pub leader_elect_retry_period: GoDuration,

    /// Port of the admission webhooks (HTTPS, every interface).
    #[arg(long, env = "CAPTF_WEBHOOK_PORT", default_value_t = 9443,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_port: u16,

    /// Directory holding the webhook's serving certificate and key.
    #[arg(
        long,
        env = "CAPTF_WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs/"
    )]
    pub webhook_cert_dir: PathBuf,

    #[arg(long, env = "CAPTF_WEBHOOK_CERT_NAME", default_value = "tls.crt")]
    pub webhook_cert_name: String,

    #[arg(long, env = "CAPTF_WEBHOOK_KEY_NAME", default_value = "tls.key")]
    pub webhook_key_name: String,

    /// Address of /healthz and /readyz.
    #[arg(long, env = "CAPTF_HEALTH_ADDR", default_value = ":9440")]
    pub health_addr: String,

    /// Address of /metrics; "0" turns it off.
    #[arg(long, env = "CAPTF_DIAGNOSTICS_ADDRESS", default_value = ":8443")]
    pub diagnostics_address: String,

    /// Serve /metrics over plain HTTP without authentication.
    #[arg(long, env = "CAPTF_INSECURE_DIAGNOSTICS", default_value = "false",
          action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub insecure_diagnostics: bool,

    /// Path to a kubeconfig; in-cluster configuration or $KUBECONFIG when unset.
    #[arg(long, env = "CAPTF_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    #[arg(long, env = "CAPTF_TERRAFORMCLUSTER_CONCURRENCY", default_value_t = 10,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub terraformcluster_concurrency: u16,

    #[arg(long, env = "CAPTF_TERRAFORMMACHINE_CONCURRENCY", default_value_t = 10,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub terraformmachine_concurrency: u16,

    #[arg(long, env = "CAPTF_TERRAFORMMACHINEPOOL_CONCURRENCY", default_value_t = 10,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub terraformmachinepool_concurrency: u16,

    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "CAPTF_LOGGING_FORMAT", value_enum, default_value = "text")]
    pub logging_format: LoggingFormat,

    /// Drift interval for objects that set none.
    #[arg(long, env = "CAPTF_DRIFT_DEFAULT_INTERVAL", default_value = "30m0s")]
    pub drift_default_interval: GoDuration,

    /// Runners emit progress events.
    #[arg(long, env = "CAPTF_RUNNER_EVENTS", default_value = "true",
          action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub runner_events: bool,

    /// How long /readyz answers 503 before the listeners stop on SIGTERM, so
    /// that endpoints drop this replica before its webhook goes away. Not a
    /// flag of the Go manager.
    #[arg(long, env = "CAPTF_SHUTDOWN_DELAY", default_value = "5s")]
    pub shutdown_delay: GoDuration,
}

/// What to do instead of running the manager.
#[derive(Clone, Debug, PartialEq, Eq, clap::Subcommand)]
pub enum Command {
    /// Print the CustomResourceDefinitions as one YAML stream.
    Crds,
    /// Keep the webhook's self-signed serving certificate in step (its
    /// Secret, the webhooks' caBundle, the files in --webhook-cert-dir),
    /// then exit: the init container of an install without cert-manager.
    Certs(super::certs::CertsArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// A combination of flags the manager refuses to start with.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    #[error("--{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
    #[error("--{a} and --{b} both listen on {addr}")]
    SameAddress {
        a: &'static str,
        b: &'static str,
        addr: SocketAddr,
    },
}

impl Categorized for FlagError {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> FlagError {
    FlagError::Invalid {
        flag,
        reason: reason.into(),
    }
}

impl Flags {
    /// Parses the process's arguments, accepting underscores for dashes in
    /// flag names as the Go manager does (exits with usage on a parse error).
    pub fn from_args() -> Self {
        Self::parse_from(normalize_args(std::env::args_os()))
    }

    /// Resolves `--runner-image` from `manager_image` (the value of
    /// `$CAPTF_MANAGER_IMAGE`, else the image of the manager's own
    /// container) when unset, and checks the combinations.
    pub fn resolve(mut self, manager_image: Option<String>) -> Result<Self, FlagError> {
        if self.runner_image.is_empty() {
            self.runner_image = manager_image.unwrap_or_default();
        }
        if self.runner_image.is_empty() {
            return Err(invalid(
                "runner-image",
                "no runner image: set --runner-image or $CAPTF_MANAGER_IMAGE (outside a pod whose image can be read)",
            ));
        }
        if let Err(e) = ImageRef::parse(&self.runner_image) {
            return Err(invalid(
                "runner-image",
                format!("{:?} {e}", self.runner_image),
            ));
        }
        self.check()?;
        Ok(self)
    }

    /// Checks the combinations of every flag but `--runner-image`, which
    /// may need the API server to resolve.
    pub fn check(&self) -> Result<(), FlagError> {
        if !self.namespace.is_empty() && !is_dns1123_label(&self.namespace) {
            return Err(invalid(
                "namespace",
                format!("{:?} is not a namespace name", self.namespace),
            ));
        }
        if !self.watch_filter.is_empty() && !is_label_value(&self.watch_filter) {
            return Err(invalid(
                "watch-filter",
                format!("{:?} is not a label value", self.watch_filter),
            ));
        }
        for (flag, value) in [
            ("sync-period", self.sync_period),
            ("drift-default-interval", self.drift_default_interval),
            (
                "leader-elect-lease-duration",
                self.leader_elect_lease_duration,
            ),
            (
                "leader-elect-renew-deadline",
                self.leader_elect_renew_deadline,
            ),
            ("leader-elect-retry-period", self.leader_elect_retry_period),
        ] {
            if value.0.is_zero() {
                return Err(invalid(flag, "must be greater than 0"));
            }
        }
        // The same checks as client-go's leader elector, so that a
        // configuration moved over from the Go manager behaves the same.
        if self.leader_elect_lease_duration.0 <= self.leader_elect_renew_deadline.0 {
            return Err(invalid(
                "leader-elect-lease-duration",
                format!(
                    "{} must be greater than --leader-elect-renew-deadline {}",
                    self.leader_elect_lease_duration, self.leader_elect_renew_deadline
                ),
            ));
        }
        if self.leader_elect_renew_deadline.0 <= self.leader_elect_retry_period.0.mul_f64(1.2) {
            return Err(invalid(
                "leader-elect-renew-deadline",
                format!(
                    "{} must be greater than 1.2 × --leader-elect-retry-period {}",
                    self.leader_elect_renew_deadline, self.leader_elect_retry_period
                ),
            ));
        }
        for (flag, name) in [
            ("webhook-cert-name", &self.webhook_cert_name),
            ("webhook-key-name", &self.webhook_key_name),
        ] {
            if name.is_empty() || name.contains('/') {
                return Err(invalid(flag, format!("{name:?} is not a file name")));
            }
        }
        let health = self.health_addr()?;
        let webhook = self.webhook_addr();
        let diagnostics = self.diagnostics_addr()?;
        let mut listeners = vec![("health-addr", health), ("webhook-port", webhook)];
        listeners.extend(diagnostics.map(|d| ("diagnostics-address", d)));
        for (i, (a, addr_a)) in listeners.iter().enumerate() {
            for (b, addr_b) in &listeners[i + 1..] {
                if overlap(addr_a, addr_b) {
                    return Err(FlagError::SameAddress {
                        a,
                        b,
                        addr: *addr_a,
                    });
                }
            }
        }
        Ok(())
    }

    pub fn health_addr(&self) -> Result<SocketAddr, FlagError> {
        super::parse_listen_addr(&self.health_addr).map_err(|e| invalid("health-addr", e))
    }

    /// The webhook listens on every interface, as the Go manager's does.
    pub fn webhook_addr(&self) -> SocketAddr {
        SocketAddr::from(([0, 0, 0, 0], self.webhook_port))
    }

    /// `None` when `--diagnostics-address=0` turns /metrics off.
    pub fn diagnostics_addr(&self) -> Result<Option<SocketAddr>, FlagError> {
        if self.diagnostics_address == "0" {
            return Ok(None);
        }
        super::parse_listen_addr(&self.diagnostics_address)
            .map(Some)
            .map_err(|e| invalid("diagnostics-address", e))
    }

    /// Every flag and its value, in the order of `--help`, for the start-up log.
    /// Holds no secret: no flag carries one.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        vec![
            ("state-backups", self.state_backups.to_string()),
            (
                "cluster-operation-gate",
                self.cluster_operation_gate.to_string(),
            ),
            ("runner-image", self.runner_image.clone()),
            ("namespace", self.namespace.clone()),
            ("watch-filter", self.watch_filter.clone()),
            ("sync-period", self.sync_period.to_string()),
            ("leader-elect", self.leader_elect.to_string()),
            (
                "leader-elect-lease-duration",
                self.leader_elect_lease_duration.to_string(),
            ),
            (
                "leader-elect-renew-deadline",
                self.leader_elect_renew_deadline.to_string(),
            ),
            (
                "leader-elect-retry-period",
                self.leader_elect_retry_period.to_string(),
            ),
            ("webhook-port", self.webhook_port.to_string()),
            (
                "webhook-cert-dir",
                self.webhook_cert_dir.display().to_string(),
            ),
            ("webhook-cert-name", self.webhook_cert_name.clone()),
            ("webhook-key-name", self.webhook_key_name.clone()),
            ("health-addr", self.health_addr.clone()),
            ("diagnostics-address", self.diagnostics_address.clone()),
            (
                "insecure-diagnostics",
                self.insecure_diagnostics.to_string(),
            ),
            ("kubeconfig", path(&self.kubeconfig)),
            (
                "terraformcluster-concurrency",
                self.terraformcluster_concurrency.to_string(),
            ),
            (
                "terraformmachine-concurrency",
                self.terraformmachine_concurrency.to_string(),
            ),
            (
                "terraformmachinepool-concurrency",
                self.terraformmachinepool_concurrency.to_string(),
            ),
            (
                "logging-format",
                match self.logging_format {
                    LoggingFormat::Text => "text".into(),
                    LoggingFormat::Json => "json".into(),
                },
            ),
            (
                "drift-default-interval",
                self.drift_default_interval.to_string(),
            ),
            ("runner-events", self.runner_events.to_string()),
            ("shutdown-delay", self.shutdown_delay.to_string()),
        ]
    }
}

/// Two listen addresses collide when their ports are equal and either binds
/// every interface or both bind the same one. Port 0 picks a free port.
fn overlap(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Rewrites `--flag_name[=v]` to `--flag-name[=v]`, the way the Go manager's
/// flag set normalizes names. Values and everything after `--` stay as given.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut rest_verbatim = false;
    args.into_iter()
        .map(|arg| {
            if rest_verbatim {
                return arg;
            }
            let Some(text) = arg.to_str() else {
                return arg;
            };
            if text == "--" {
                rest_verbatim = true;
                return arg;
            }
            let Some(body) = text.strip_prefix("--") else {
                return arg;
            };
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            let name = name.replace('_', "-");
            match value {
                Some(v) => format!("--{name}={v}").into(),
                None => format!("--{name}").into(),
            }
        })
        .collect()
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (true or false)")),
    }
}

/// A duration written the Go way: `1h30m`, `10m0s`, `1.5s`, `300ms`, `0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a duration (e.g. 30s, 10m0s, 1h)");
        if s == "0" {
            return Ok(Self(Duration::ZERO));
        }
        if s.is_empty() || s.starts_with('-') {
            return Err(bad());
        }
        let mut rest = s.strip_prefix('+').unwrap_or(s);
        let mut nanos: u128 = 0;
        while !rest.is_empty() {
            let digits_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            let (number, tail) = rest.split_at(digits_end);
            let unit_end = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            let (unit, next) = tail.split_at(unit_end);
            let unit_nanos: u128 = match unit {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60_000_000_000,
                "h" => 3_600_000_000_000,
                _ => return Err(bad()),
            };
            let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
            if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
                return Err(bad());
            }
            let whole: u128 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad())?
            };
            nanos = nanos
                .checked_add(whole.checked_mul(unit_nanos).ok_or_else(bad)?)
                .ok_or_else(bad)?;
            // Fraction digits beyond nanosecond precision are dropped, as in Go.
            let mut scale = unit_nanos;
            for digit in frac.bytes() {
                scale /= 10;
                nanos += u128::from(digit - b'0') * scale;
            }
            rest = next;
        }
        let nanos = u64::try_from(nanos).map_err(|_| bad())?;
        Ok(Self(Duration::from_nanos(nanos)))
    }
}

impl fmt::Display for GoDuration {
    /// Go's `time.Duration.String`: `10m0s`, `1h0m0s`, `1.5s`, `300ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        let fraction = |value: u128, digits: u32| -> String {
            let whole = value / 10u128.pow(digits);
            let frac = value % 10u128.pow(digits);
            if frac == 0 {
                whole.to_string()
            } else {
                let frac = format!("{frac:0width$}", width = digits as usize);
                format!("{whole}.{}", frac.trim_end_matches('0'))
            }
        };
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000 {
            return write!(f, "{nanos}ns");
        }
        if nanos < 1_000_000 {
            return write!(f, "{}µs", fraction(nanos, 3));
        }
        if nanos < 1_000_000_000 {
            return write!(f, "{}ms", fraction(nanos, 6));
        }
        let secs = nanos / 1_000_000_000;
        let sub = nanos % 1_000_000_000;
        let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if hours > 0 || minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write!(f, "{}s", fraction(seconds * 1_000_000_000 + sub, 9))
    }
}

fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.is_empty()
}

fn is_label_value(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    s.len() <= 63
        && bytes.first().is_some_and(|b| alnum(*b))
        && bytes.last().is_some_and(|b| alnum(*b))
        && bytes
            .iter()
            .all(|b| alnum(*b) || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests;
