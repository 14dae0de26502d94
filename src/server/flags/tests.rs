use super::*;
use clap::CommandFactory;

fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
    let argv = std::iter::once("captf-manager")
        .chain(args.iter().copied())
        .map(OsString::from);
    Flags::try_parse_from(normalize_args(argv))
}

fn resolved(args: &[&str]) -> Result<Flags, FlagError> {
    parse(args)
        .expect("flags parse")
        .resolve(Some("registry.example/captf:v1".into()))
}

#[test]
fn defaults_are_the_go_managers() {
    let flags = resolved(&[]).unwrap();
    assert_eq!(flags.state_backups, 5);
    assert!(flags.cluster_operation_gate);
    assert_eq!(flags.runner_image, "registry.example/captf:v1");
    assert_eq!(flags.sync_period.0, Duration::from_secs(600));
    assert!(!flags.leader_elect);
    assert_eq!(flags.leader_elect_lease_duration.0, Duration::from_secs(15));
    assert_eq!(flags.leader_elect_renew_deadline.0, Duration::from_secs(10));
    assert_eq!(flags.leader_elect_retry_period.0, Duration::from_secs(2));
    assert_eq!(flags.webhook_port, 9443);
    assert_eq!(
        flags.webhook_cert_dir,
        PathBuf::from("/tmp/k8s-webhook-server/serving-certs/")
    );
    assert_eq!(
        (
            flags.webhook_cert_name.as_str(),
            flags.webhook_key_name.as_str()
        ),
        ("tls.crt", "tls.key")
    );
    assert_eq!(flags.health_addr, ":9440");
    assert_eq!(flags.diagnostics_address, ":8443");
    assert!(!flags.insecure_diagnostics);
    // No TerraformMachineTemplate reconciler runs yet: its concurrency
    // flag is refused rather than ignored.
    assert!(parse(&["--terraformmachinetemplate-concurrency=5"]).is_err());
    assert_eq!(flags.logging_format, LoggingFormat::Text);
    assert_eq!(flags.drift_default_interval.0, Duration::from_secs(1800));
    assert!(flags.runner_events);
    assert_eq!(flags.command, None);
    assert_eq!(parse(&["crds"]).unwrap().command, Some(Command::Crds));
}

#[test]
fn booleans_take_go_spellings_and_need_an_equals_sign() {
    let flags = parse(&[
        "--leader-elect",
        "--cluster-operation-gate=false",
        "--runner-events=F",
    ])
    .unwrap();
    assert!(flags.leader_elect);
    assert!(!flags.cluster_operation_gate);
    assert!(!flags.runner_events);
    assert!(parse(&["--leader-elect=maybe"]).is_err());
    // Without '=' the next word is not the flag's value.
    assert!(parse(&["--leader-elect", "false"]).is_err());
}

#[test]
fn underscores_are_dashes_in_names_only() {
    let flags = parse(&["--webhook_port=9000", "--watch_filter", "a_b"]).unwrap();
    assert_eq!(flags.webhook_port, 9000);
    assert_eq!(flags.watch_filter, "a_b");
}

#[test]
fn every_flag_reads_its_environment_variable() {
    // Declared names only: setting variables here would leak into the
    // other tests of this process, which parse flags in parallel.
    let cmd = Flags::command();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        let want = format!("CAPTF_{}", long.replace('-', "_").to_uppercase());
        assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(&want)), "--{long}");
    }
}

#[test]
fn every_flag_is_logged() {
    let flags = resolved(&[]).unwrap();
    let logged: Vec<&str> = flags.describe().into_iter().map(|(name, _)| name).collect();
    let declared: Vec<String> = Flags::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|l| l != "help" && l != "version")
        .collect();
    assert_eq!(logged, declared);
}

#[test]
fn go_durations() {
    let table = [
        ("10m0s", Some(600_000)),
        ("30s", Some(30_000)),
        ("1h", Some(3_600_000)),
        ("1h30m", Some(5_400_000)),
        ("1.5s", Some(1_500)),
        ("300ms", Some(300)),
        (".5m", Some(30_000)),
        ("0", Some(0)),
        ("", None),
        ("10", None),
        ("-1s", None),
        ("5d", None),
        ("1.2.3s", None),
        ("s", None),
    ];
    for (input, want) in table {
        let got = input
            .parse::<GoDuration>()
            .ok()
            .map(|d| d.0.as_millis() as u64);
        assert_eq!(got, want, "{input:?}");
    }
    let shown: Vec<String> = [
        "10m",
        "1h",
        "30s",
        "1.5s",
        "300ms",
        "1h2m3.25s",
        "0s",
        "1500ns",
    ]
    .iter()
    .map(|s| s.parse::<GoDuration>().unwrap().to_string())
    .collect();
    assert_eq!(
        shown,
        [
            "10m0s",
            "1h0m0s",
            "30s",
            "1.5s",
            "300ms",
            "1h2m3.25s",
            "0s",
            "1.5µs"
        ]
    );
}

#[test]
fn invalid_combinations_are_refused() {
    let refused = [
        (
            vec!["--leader-elect-renew-deadline=20s"],
            "leader-elect-lease-duration",
        ),
        (
            vec!["--leader-elect-retry-period=9s"],
            "leader-elect-renew-deadline",
        ),
        (vec!["--sync-period=0"], "sync-period"),
        (vec!["--health-addr=:8443"], "diagnostics-address"),
        (
            vec!["--webhook-port=9440", "--health-addr=127.0.0.1:9440"],
            "webhook-port",
        ),
        (vec!["--namespace=Not_A_Namespace"], "namespace"),
        (vec!["--watch-filter=-x"], "watch-filter"),
        (vec!["--runner-image=Registry/UPPER:tag"], "runner-image"),
        (vec!["--webhook-cert-name=a/b"], "webhook-cert-name"),
        (vec!["--health-addr=9440"], "health-addr"),
    ];
    for (args, flag) in refused {
        let err = resolved(&args).expect_err(&format!("{args:?} must be refused"));
        assert!(err.to_string().contains(flag), "{args:?}: {err}");
    }
    assert!(parse(&["--webhook-port=0"]).is_err());
    assert!(parse(&["--terraformmachine-concurrency=0"]).is_err());
    assert!(parse(&["--logging-format=xml"]).is_err());
    // Different interfaces on one port do not collide; "0" turns metrics off.
    resolved(&[
        "--health-addr=127.0.0.1:8443",
        "--diagnostics-address=127.0.0.2:8443",
    ])
    .unwrap();
    resolved(&["--diagnostics-address=0", "--health-addr=:8443"]).unwrap();
}

#[test]
fn runner_image_falls_back_to_the_manager_image() {
    let flags = parse(&[]).unwrap();
    let err = flags.clone().resolve(None).unwrap_err();
    assert!(err.to_string().contains("CAPTF_MANAGER_IMAGE"), "{err}");
    let own = parse(&["--runner-image=ghcr.io/o/r@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"]).unwrap();
    let own = own.resolve(Some("other:1".into())).unwrap();
    assert_eq!(
        own.runner_image,
        "ghcr.io/o/r@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
}
