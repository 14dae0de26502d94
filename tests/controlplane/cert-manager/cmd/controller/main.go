// Command controller is cert-manager's controller manager wired from the main
// module: cert-manager's configuration types and defaults, its
// ContextFactory, and every controller registered in controller.Known()
// (Issuers, ClusterIssuers, Certificates, CertificateRequests for the
// selfSigned, CA, ACME, Vault and Venafi issuers, ingress-shim), run behind
// Lease leader election, with the metrics (:9402) and /livez (:9403)
// endpoints the Helm chart expects.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"

	config "github.com/cert-manager/cert-manager/internal/apis/config/controller"
	configscheme "github.com/cert-manager/cert-manager/internal/apis/config/controller/scheme"
	defaults "github.com/cert-manager/cert-manager/internal/apis/config/controller/v1alpha1"
	"github.com/cert-manager/cert-manager/internal/apis/config/controller/validation"
	"github.com/cert-manager/cert-manager/internal/controller/feature"
	"github.com/cert-manager/cert-manager/internal/pem"
	configv1alpha1 "github.com/cert-manager/cert-manager/pkg/apis/config/controller/v1alpha1"
	"github.com/cert-manager/cert-manager/pkg/controller"
	shimgateways "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/gateways"
	shimlistenersets "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/listenerset"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	controllerconfigfile "github.com/cert-manager/cert-manager/pkg/controller/configfile"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	dnsutil "github.com/cert-manager/cert-manager/pkg/issuer/acme/dns/util"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/server"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	"github.com/cert-manager/cert-manager/captf-build/internal/boot"

	// The issuer implementations register themselves by type; the
	// controllers register themselves through the defaults package above.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/acme"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/vault"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/venafi"
)

func main() {
	boot.Main(boot.Component[config.ControllerConfiguration]{
		Name:  "controller",
		New:   newConfig,
		Flags: flags,
		File: func() (configfile.ConfigFile, func() *config.ControllerConfiguration) {
			f := controllerconfigfile.New()
			return f, func() *config.ControllerConfiguration { return f.Config }
		},
		Gates:   func(c *config.ControllerConfiguration) map[string]bool { return c.FeatureGates },
		Logging: func(c *config.ControllerConfiguration) *logsapi.LoggingConfiguration { return &c.Logging },
		Validate: func(c *config.ControllerConfiguration) field.ErrorList {
			return validation.ValidateControllerConfiguration(c, nil)
		},
		Run: run,
	})
}

// newConfig returns cert-manager's v1alpha1 defaults in the internal type.
func newConfig() (*config.ControllerConfiguration, error) {
	scheme, _, err := configscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	v := &configv1alpha1.ControllerConfiguration{}
	scheme.Default(v)
	c := &config.ControllerConfiguration{}
	return c, scheme.Convert(v, c, nil)
}

// flags covers every argument the Helm chart's deployment.yaml can pass, and
// the common tuning flags; the rest (metrics TLS, PEM size limits, backoff,
// gateway API extras) is set through --config.
func flags(fs *pflag.FlagSet, c *config.ControllerConfiguration) {
	fs.StringVar(&c.KubeConfig, "kubeconfig", c.KubeConfig, "kubeconfig path (default $KUBECONFIG, else in-cluster)")
	fs.StringVar(&c.APIServerHost, "master", c.APIServerHost, "API server address, overriding the kubeconfig")
	fs.Float32Var(&c.KubernetesAPIQPS, "kube-api-qps", c.KubernetesAPIQPS, "API client QPS")
	fs.IntVar(&c.KubernetesAPIBurst, "kube-api-burst", c.KubernetesAPIBurst, "API client burst")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "watch only this namespace (disables ClusterIssuers)")
	fs.StringVar(&c.ClusterResourceNamespace, "cluster-resource-namespace", c.ClusterResourceNamespace, "namespace of the Secrets that ClusterIssuers refer to")
	boot.LeaderElectionFlags(fs, &c.LeaderElectionConfig.LeaderElectionConfig)
	le := &c.LeaderElectionConfig
	fs.DurationVar(&le.HealthzTimeout, "internal-healthz-leader-election-timeout", le.HealthzTimeout, "grace after lease expiry before /livez fails")
	fs.StringSliceVar(&c.Controllers, "controllers", c.Controllers, "controllers to run: '*' for the defaults, 'name' to add, '-name' to remove; known: "+strings.Join(defaults.AllControllers, ", "))
	h := &c.ACMEHTTP01Config
	fs.StringVar(&h.SolverImage, "acme-http01-solver-image", h.SolverImage, "ACME HTTP01 solver image")
	fs.StringVar(&h.SolverResourceRequestCPU, "acme-http01-solver-resource-request-cpu", h.SolverResourceRequestCPU, "solver pod CPU request")
	fs.StringVar(&h.SolverResourceRequestMemory, "acme-http01-solver-resource-request-memory", h.SolverResourceRequestMemory, "solver pod memory request")
	fs.StringVar(&h.SolverResourceLimitsCPU, "acme-http01-solver-resource-limits-cpu", h.SolverResourceLimitsCPU, "solver pod CPU limit")
	fs.StringVar(&h.SolverResourceLimitsMemory, "acme-http01-solver-resource-limits-memory", h.SolverResourceLimitsMemory, "solver pod memory limit")
	fs.BoolVar(&h.SolverRunAsNonRoot, "acme-http01-solver-run-as-non-root", h.SolverRunAsNonRoot, "run solver pods as non-root")
	fs.StringSliceVar(&h.SolverNameservers, "acme-http01-solver-nameservers", h.SolverNameservers, "host:port DNS servers for HTTP01 self checks")
	fs.Var(cliflag.NewMapStringString(&h.SolverExtraLabels), "acme-http01-solver-extra-labels", "key=value labels for HTTP01 solver resources")
	fs.StringVar(&h.SolverRuntimeClassName, "acme-http01-solver-runtime-class-name", h.SolverRuntimeClassName, "RuntimeClassName of solver pods")
	d := &c.ACMEDNS01Config
	fs.StringSliceVar(&d.RecursiveNameservers, "dns01-recursive-nameservers", d.RecursiveNameservers, "host:port or https:// DoH servers for DNS01 self checks")
	fs.BoolVar(&d.RecursiveNameserversOnly, "dns01-recursive-nameservers-only", d.RecursiveNameserversOnly, "query only the recursive nameservers")
	fs.DurationVar(&d.CheckRetryPeriod, "dns01-check-retry-period", d.CheckRetryPeriod, "wait between propagation checks")
	fs.BoolVar(&c.ClusterIssuerAmbientCredentials, "cluster-issuer-ambient-credentials", c.ClusterIssuerAmbientCredentials, "let ClusterIssuers use ambient credentials")
	fs.BoolVar(&c.IssuerAmbientCredentials, "issuer-ambient-credentials", c.IssuerAmbientCredentials, "let Issuers use ambient credentials")
	s := &c.IngressShimConfig
	fs.StringSliceVar(&s.DefaultAutoCertificateAnnotations, "auto-certificate-annotations", s.DefaultAutoCertificateAnnotations, "ingress annotations that request a certificate")
	fs.StringSliceVar(&s.ExtraCertificateAnnotations, "extra-certificate-annotations", s.ExtraCertificateAnnotations, "ingress annotations copied to certificates")
	fs.StringVar(&s.DefaultIssuerName, "default-issuer-name", s.DefaultIssuerName, "ingress-shim default issuer name")
	fs.StringVar(&s.DefaultIssuerKind, "default-issuer-kind", s.DefaultIssuerKind, "ingress-shim default issuer kind")
	fs.StringVar(&s.DefaultIssuerGroup, "default-issuer-group", s.DefaultIssuerGroup, "ingress-shim default issuer group")
	fs.BoolVar(&c.EnableCertificateOwnerRef, "enable-certificate-owner-ref", c.EnableCertificateOwnerRef, "make Certificates own their Secrets")
	fs.BoolVar(&c.GatewayAPIConfig.Enabled, "enable-gateway-api", c.GatewayAPIConfig.Enabled, "enable the Gateway API integration")
	fs.StringSliceVar(&c.CopiedAnnotationPrefixes, "copied-annotation-prefixes", c.CopiedAnnotationPrefixes, "annotation prefixes copied to CertificateRequests ('-' excludes)")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "feature gates, key=value pairs: "+strings.Join(utilfeature.DefaultFeatureGate.KnownFeatures(), "; "))
	fs.IntVar(&c.NumberOfConcurrentWorkers, "concurrent-workers", c.NumberOfConcurrentWorkers, "workers per controller")
	fs.IntVar(&c.MaxConcurrentChallenges, "max-concurrent-challenges", c.MaxConcurrentChallenges, "ACME challenges processed at once")
	fs.StringVar(&c.MetricsListenAddress, "metrics-listen-address", c.MetricsListenAddress, "metrics address")
	fs.StringVar(&c.HealthzListenAddress, "internal-healthz-listen-address", c.HealthzListenAddress, "address of the /livez server")
	logf.AddFlags(&c.Logging, fs)
}

func run(ctx context.Context, c *config.ControllerConfiguration) error {
	log := logf.FromContext(ctx)
	c.KubeConfig = boot.KubeConfig(c.KubeConfig)
	// Validation has checked the limits; the PEM decoders read them globally.
	l := c.PEMSizeLimitsConfig
	pem.SetGlobalSizeLimits(pem.NewSizeLimitsFromConfig(l.MaxCertificateSize, l.MaxPrivateKeySize, l.MaxChainLength, l.MaxBundleSize))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)

	opts, err := contextOptions(c)
	if err != nil {
		return err
	}
	factory, err := controller.NewContextFactory(ctx, opts)
	if err != nil {
		return err
	}
	cctx, err := factory.Build()
	if err != nil {
		return err
	}
	enabled := enabledControllers(c)
	log.Info("enabled controllers", "controllers", sets.List(enabled))

	serve := func(srv *http.Server, ln net.Listener) {
		g.Go(func() error {
			<-ctx.Done()
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(stop) //nolint:contextcheck // ctx is already done
		})
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}

	// Metrics, over TLS when the configuration says so.
	certs := boot.CertificateSource(c.MetricsTLSConfig, cctx.RESTConfig, "cert-manager")
	if certs != nil {
		g.Go(func() error {
			if err := certs.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		})
	}
	metricsLn, err := server.Listen(ctx, "tcp", c.MetricsListenAddress, server.WithCertificateSource(certs),
		server.WithTLSCipherSuites(c.MetricsTLSConfig.CipherSuites), server.WithTLSMinVersion(c.MetricsTLSConfig.MinTLSVersion))
	if err != nil {
		return fmt.Errorf("metrics listener %s: %w", c.MetricsListenAddress, err)
	}
	informers := cctx.SharedInformerFactory.Certmanager().V1()
	cctx.Metrics.SetupACMECollector(cctx.SharedInformerFactory.Acme().V1().Challenges().Lister())
	cctx.Metrics.SetupCertificateCollector(informers.Certificates().Lister())
	cctx.Metrics.SetupIssuerCollector(informers.Issuers().Lister())
	if enabled.Has(clusterissuers.ControllerName) {
		cctx.Metrics.SetupClusterIssuerCollector(informers.ClusterIssuers().Lister())
	}
	serve(cctx.Metrics.NewServer(metricsLn), metricsLn)

	// /livez fails when the leader elector stops renewing its lease.
	healthzLn, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.HealthzListenAddress)
	if err != nil {
		return fmt.Errorf("healthz listener %s: %w", c.HealthzListenAddress, err)
	}
	health := healthz.NewServer(c.LeaderElectionConfig.HealthzTimeout)
	g.Go(func() error { return health.Start(ctx, healthzLn) })
	log.Info("serving", "metrics", metricsLn.Addr().String(), "healthz", healthzLn.Addr().String())

	elected := make(chan struct{})
	if c.LeaderElectionConfig.Enabled {
		g.Go(func() error { return lead(ctx, c, factory, health.LeaderHealthzAdaptor, elected) })
	} else {
		close(elected)
	}
	select {
	case <-ctx.Done():
		return g.Wait()
	case <-elected:
	}

	for name, constructor := range controller.Known() {
		if !enabled.Has(name) {
			continue
		}
		ctl, err := constructor(factory)
		if err != nil {
			cancel()
			return errors.Join(fmt.Errorf("controller %s: %w", name, err), g.Wait())
		}
		g.Go(func() error { return ctl.Run(c.NumberOfConcurrentWorkers, ctx) })
	}
	// The informers the controllers asked for start only now.
	cctx.SharedInformerFactory.Start(ctx.Done())
	cctx.KubeSharedInformerFactory.Start(ctx.Done())
	cctx.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	if gatewayAPI(c) {
		cctx.GWShared.Start(ctx.Done())
	}
	return g.Wait()
}

// lead holds the cert-manager-controller Lease, closing elected once it is
// held; losing it is an error, so that the process exits and restarts.
func lead(ctx context.Context, c *config.ControllerConfiguration, factory *controller.ContextFactory, watchdog *leaderelection.HealthzAdaptor, elected chan struct{}) error {
	lctx, err := factory.Build("leader-election")
	if err != nil {
		return err
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	lock, err := resourcelock.NewWithLabels(resourcelock.LeasesResourceLock, c.LeaderElectionConfig.Namespace, "cert-manager-controller",
		lctx.Client.CoreV1(), lctx.Client.CoordinationV1(),
		// A unique suffix (as controller-runtime uses for cainjector) keeps two
		// instances on one host, as in the tests, from both thinking they lead.
		resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID()) + "-external-cert-manager-controller", EventRecorder: lctx.Recorder},
		map[string]string{"app.kubernetes.io/managed-by": "cert-manager"})
	if err != nil {
		return err
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaderElectionConfig.LeaseDuration,
		RenewDeadline:   c.LeaderElectionConfig.RenewDeadline,
		RetryPeriod:     c.LeaderElectionConfig.RetryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(elected) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("leader election lost")
}

// enabledControllers expands --controllers ('*', 'name', '-name') over
// cert-manager's default and experimental controller lists.
func enabledControllers(c *config.ControllerConfiguration) sets.Set[string] {
	enabled, disabled := sets.New[string](), sets.New[string]()
	for _, name := range c.Controllers {
		switch {
		case name == "*":
			enabled.Insert(defaults.DefaultEnabledControllers...)
		case strings.HasPrefix(name, "-"):
			disabled.Insert(strings.TrimPrefix(name, "-"))
		default:
			enabled.Insert(name)
		}
	}
	if enabled.Len() == 0 && disabled.Len() > 0 {
		enabled.Insert(defaults.DefaultEnabledControllers...) // only removals: '*' is implied
	}
	if utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalCertificateSigningRequestControllers) {
		enabled.Insert(defaults.ExperimentalCertificateSigningRequestControllers...)
	}
	if gatewayAPI(c) {
		enabled.Insert(shimgateways.ControllerName)
		if c.GatewayAPIConfig.EnableListenerSet && utilfeature.DefaultFeatureGate.Enabled(feature.ListenerSets) {
			enabled.Insert(shimlistenersets.ControllerName)
		}
	}
	if c.Namespace != "" {
		enabled.Delete(defaults.ClusterScopedControllers...)
	}
	return enabled.Delete(disabled.UnsortedList()...)
}

func gatewayAPI(c *config.ControllerConfiguration) bool {
	return c.GatewayAPIConfig.Enabled && utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalGatewayAPISupport)
}

// contextOptions maps the configuration onto controller.ContextOptions.
func contextOptions(c *config.ControllerConfiguration) (controller.ContextOptions, error) {
	h := c.ACMEHTTP01Config
	var quantities [4]resource.Quantity
	for i, s := range []string{h.SolverResourceRequestCPU, h.SolverResourceRequestMemory, h.SolverResourceLimitsCPU, h.SolverResourceLimitsMemory} {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return controller.ContextOptions{}, fmt.Errorf("ACME HTTP01 solver resources %q: %w", s, err)
		}
		quantities[i] = q
	}
	nameservers := c.ACMEDNS01Config.RecursiveNameservers
	if len(nameservers) == 0 {
		nameservers = dnsutil.RecursiveNameservers
	}
	return controller.ContextOptions{
		Kubeconfig:         c.KubeConfig,
		APIServerHost:      c.APIServerHost,
		KubernetesAPIQPS:   c.KubernetesAPIQPS,
		KubernetesAPIBurst: c.KubernetesAPIBurst,
		Namespace:          c.Namespace,
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverImage:                 h.SolverImage,
			HTTP01SolverResourceRequestCPU:    quantities[0],
			HTTP01SolverResourceRequestMemory: quantities[1],
			HTTP01SolverResourceLimitsCPU:     quantities[2],
			HTTP01SolverResourceLimitsMemory:  quantities[3],
			ACMEHTTP01SolverRunAsNonRoot:      h.SolverRunAsNonRoot,
			HTTP01SolverRuntimeClassName:      h.SolverRuntimeClassName,
			HTTP01SolverNameservers:           h.SolverNameservers,
			HTTP01SolverExtraLabels:           h.SolverExtraLabels,
			DNS01Nameservers:                  nameservers,
			DNS01CheckRetryPeriod:             c.ACMEDNS01Config.CheckRetryPeriod,
			DNS01CheckAuthoritative:           !c.ACMEDNS01Config.RecursiveNameserversOnly,
		},
		SchedulerOptions: controller.SchedulerOptions{MaxConcurrentChallenges: c.MaxConcurrentChallenges},
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace:        c.ClusterResourceNamespace,
			ClusterIssuerAmbientCredentials: c.ClusterIssuerAmbientCredentials,
			IssuerAmbientCredentials:        c.IssuerAmbientCredentials,
		},
		IngressShimOptions: controller.IngressShimOptions{
			DefaultIssuerName:                 c.IngressShimConfig.DefaultIssuerName,
			DefaultIssuerKind:                 c.IngressShimConfig.DefaultIssuerKind,
			DefaultIssuerGroup:                c.IngressShimConfig.DefaultIssuerGroup,
			DefaultAutoCertificateAnnotations: c.IngressShimConfig.DefaultAutoCertificateAnnotations,
			ExtraCertificateAnnotations:       c.IngressShimConfig.ExtraCertificateAnnotations,
			GatewayAPIExtraProtocols:          sets.New(c.GatewayAPIConfig.ExtraProtocols...),
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef:                           c.EnableCertificateOwnerRef,
			CopiedAnnotationPrefixes:                 c.CopiedAnnotationPrefixes,
			CertificateRequestMinimumBackoffDuration: c.CertificateRequestMinimumBackoffDuration,
			CertificateRequestMaximumBackoffDuration: c.CertificateRequestMaximumBackoffDuration,
		},
		ConfigOptions: controller.ConfigOptions{
			EnableGatewayAPI:            c.GatewayAPIConfig.Enabled,
			EnableGatewayAPIListenerSet: c.GatewayAPIConfig.EnableListenerSet,
		},
	}, nil
}
