// Package boot is the start-up sequence the three binaries share, on top of
// cert-manager's own configuration types: versioned defaults, then an
// optional --config file, then command-line flags (which win over the file),
// then feature gates, validation and logging.
package boot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"
	logsapi "k8s.io/component-base/logs/api/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cert-manager/cert-manager/internal/apis/config/shared"
	cmdutil "github.com/cert-manager/cert-manager/internal/cmd/util"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	servertls "github.com/cert-manager/cert-manager/pkg/server/tls"
	"github.com/cert-manager/cert-manager/pkg/server/tls/authority"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
)

// Component describes one binary in terms of its internal configuration type C.
type Component[C any] struct {
	Name string
	// New returns the v1alpha1 defaults converted to the internal type.
	New func() (*C, error)
	// Flags binds the command-line flags to fields of the configuration.
	Flags func(*pflag.FlagSet, *C)
	// File returns the component's config-file decoder and where it puts
	// the decoded configuration once loaded.
	File func() (configfile.ConfigFile, func() *C)
	// Gates, Logging and Validate give access to the feature gates, the
	// logging options and cert-manager's validation of the configuration.
	Gates    func(*C) map[string]bool
	Logging  func(*C) *logsapi.LoggingConfiguration
	Validate func(*C) field.ErrorList
	// Run runs the component until ctx is cancelled.
	Run func(context.Context, *C) error
}

// Main runs a component as the process, exiting non-zero on error and
// shutting down gracefully on SIGINT/SIGTERM.
func Main[C any](c Component[C]) {
	ctx, exit := cmdutil.SetupExitHandler(context.Background(), cmdutil.GracefulShutdown)
	defer exit() // may call os.Exit, so it runs last

	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log) // controller-runtime logs through the same logger
	ctx = logf.NewContext(ctx, logf.Log, c.Name)

	if err := run(ctx, c, os.Args[1:]); err != nil {
		logf.Log.Error(err, "error executing command")
		cmdutil.SetExitCode(err)
	}
}

func run[C any](ctx context.Context, c Component[C], args []string) error {
	cfg, err := c.New()
	if err != nil {
		return err
	}
	var file string
	// parse binds a fresh flag set to cfg, so that a second parse after the
	// config file was loaded applies only the flags actually given.
	parse := func() error {
		fs := pflag.NewFlagSet(c.Name, pflag.ContinueOnError)
		fs.StringVar(&file, "config", file, "Path to a file with the component's v1alpha1 configuration object")
		c.Flags(fs, cfg)
		return fs.Parse(args)
	}
	if err := parse(); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	// Feature gates given as flags may matter while decoding the file.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(c.Gates(cfg)); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if file != "" {
		path, err := filepath.Abs(file)
		if err != nil {
			return err
		}
		loader, err := configfile.NewConfigurationFSLoader(nil, path)
		if err != nil {
			return err
		}
		decoder, loaded := c.File()
		if err := loader.Load(decoder); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
		*cfg = *loaded()
		if err := parse(); err != nil {
			return err
		}
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(c.Gates(cfg)); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if errs := c.Validate(cfg); len(errs) > 0 {
		return fmt.Errorf("invalid configuration: %w", errs.ToAggregate())
	}
	if err := logf.ValidateAndApply(c.Logging(cfg)); err != nil {
		return err
	}
	return c.Run(ctx, cfg)
}

// CertificateSource returns what serves a metrics endpoint over TLS when the
// configuration asks for it (files or a dynamic CA in a Secret), else nil.
func CertificateSource(c shared.TLSConfig, rc *rest.Config, managedBy string) servertls.CertificateSource {
	switch {
	case c.FilesystemConfigProvided():
		return &servertls.FileCertificateSource{CertPath: c.Filesystem.CertFile, KeyPath: c.Filesystem.KeyFile}
	case c.DynamicConfigProvided():
		return &servertls.DynamicSource{
			DNSNames: c.Dynamic.DNSNames,
			Authority: &authority.DynamicAuthority{
				SecretNamespace: c.Dynamic.SecretNamespace,
				SecretName:      c.Dynamic.SecretName,
				SecretLabels:    map[string]string{"app.kubernetes.io/managed-by": managedBy},
				LeafDuration:    c.Dynamic.LeafDuration,
				RESTConfig:      rc,
			},
		}
	}
	return nil
}

// KubeConfig returns the kubeconfig path to use: the flag or config value,
// else $KUBECONFIG, so the binaries also run as plain host processes; empty
// means the in-cluster configuration.
func KubeConfig(configured string) string {
	if configured != "" {
		return configured
	}
	return os.Getenv("KUBECONFIG")
}

// LeaderElectionFlags are the --leader-elect* flags the chart passes, for
// the controller and cainjector alike.
func LeaderElectionFlags(fs *pflag.FlagSet, le *shared.LeaderElectionConfig) {
	fs.BoolVar(&le.Enabled, "leader-elect", le.Enabled, "run leader election")
	fs.StringVar(&le.Namespace, "leader-election-namespace", le.Namespace, "namespace of the leader election Lease")
	fs.DurationVar(&le.LeaseDuration, "leader-election-lease-duration", le.LeaseDuration, "leader election lease duration")
	fs.DurationVar(&le.RenewDeadline, "leader-election-renew-deadline", le.RenewDeadline, "leader election renew deadline")
	fs.DurationVar(&le.RetryPeriod, "leader-election-retry-period", le.RetryPeriod, "leader election retry period")
}
