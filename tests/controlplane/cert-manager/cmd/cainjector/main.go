// Command cainjector is cert-manager's CA injector wired from the main
// module: a controller-runtime manager running pkg/controller/cainjector,
// which copies CA data into annotated webhook configurations, APIServices and
// CRDs (cert-manager.io/inject-ca-from, inject-ca-from-secret,
// inject-apiserver-ca).
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	config "github.com/cert-manager/cert-manager/internal/apis/config/cainjector"
	configscheme "github.com/cert-manager/cert-manager/internal/apis/config/cainjector/scheme"
	"github.com/cert-manager/cert-manager/internal/apis/config/cainjector/validation"
	"github.com/cert-manager/cert-manager/internal/kube"
	configv1alpha1 "github.com/cert-manager/cert-manager/pkg/apis/config/cainjector/v1alpha1"
	cainjectorconfigfile "github.com/cert-manager/cert-manager/pkg/cainjector/configfile"
	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	"github.com/cert-manager/cert-manager/captf-build/internal/boot"
)

func main() {
	boot.Main(boot.Component[config.CAInjectorConfiguration]{
		Name:  "cainjector",
		New:   defaults,
		Flags: flags,
		File: func() (configfile.ConfigFile, func() *config.CAInjectorConfiguration) {
			f := cainjectorconfigfile.New()
			return f, func() *config.CAInjectorConfiguration { return f.Config }
		},
		Gates:   func(c *config.CAInjectorConfiguration) map[string]bool { return c.FeatureGates },
		Logging: func(c *config.CAInjectorConfiguration) *logsapi.LoggingConfiguration { return &c.Logging },
		Validate: func(c *config.CAInjectorConfiguration) field.ErrorList {
			return validation.ValidateCAInjectorConfiguration(c, nil)
		},
		Run: run,
	})
}

// defaults are cert-manager's v1alpha1 defaults in the internal type.
func defaults() (*config.CAInjectorConfiguration, error) {
	scheme, _, err := configscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	v := &configv1alpha1.CAInjectorConfiguration{}
	scheme.Default(v)
	c := &config.CAInjectorConfiguration{}
	return c, scheme.Convert(v, c, nil)
}

// flags covers what the Helm chart passes (--v, --config, --leader-election-*,
// --feature-gates, --metrics-listen-address) plus the injector switches;
// metrics TLS is configured through --config only.
func flags(fs *pflag.FlagSet, c *config.CAInjectorConfiguration) {
	fs.StringVar(&c.KubeConfig, "kubeconfig", c.KubeConfig, "kubeconfig path (default $KUBECONFIG, else in-cluster)")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "only inject into resources of this namespace")
	fs.StringSliceVar(&c.IgnoreNamespaces, "ignore-namespaces", c.IgnoreNamespaces, "namespaces whose Secrets are ignored as CA sources")
	boot.LeaderElectionFlags(fs, &c.LeaderElectionConfig)
	fs.BoolVar(&c.EnableDataSourceConfig.Certificates, "enable-certificates-data-source", c.EnableDataSourceConfig.Certificates, "honour cert-manager.io/inject-ca-from (needs the Certificate CRD)")
	in := &c.EnableInjectableConfig
	fs.BoolVar(&in.ValidatingWebhookConfigurations, "enable-validatingwebhookconfigurations-injectable", in.ValidatingWebhookConfigurations, "inject into ValidatingWebhookConfigurations")
	fs.BoolVar(&in.MutatingWebhookConfigurations, "enable-mutatingwebhookconfigurations-injectable", in.MutatingWebhookConfigurations, "inject into MutatingWebhookConfigurations")
	fs.BoolVar(&in.CustomResourceDefinitions, "enable-customresourcedefinitions-injectable", in.CustomResourceDefinitions, "inject into CRD conversion webhooks")
	fs.BoolVar(&in.APIServices, "enable-apiservices-injectable", in.APIServices, "inject into APIServices")
	fs.StringVar(&c.MetricsListenAddress, "metrics-listen-address", c.MetricsListenAddress, "metrics address; 0 disables metrics")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "feature gates, key=value pairs: "+strings.Join(utilfeature.DefaultFeatureGate.KnownFeatures(), "; "))
	logf.AddFlags(&c.Logging, fs)
}

func run(ctx context.Context, c *config.CAInjectorConfiguration) error {
	base, err := kube.BuildClientConfig("", boot.KubeConfig(c.KubeConfig))
	if err != nil {
		return err
	}
	// The user agent names the field manager of the server-side applies.
	rc := util.RestConfigWithUserAgent(base, "cainjector")

	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))

	metrics := metricsserver.Options{BindAddress: c.MetricsListenAddress}
	certs := boot.CertificateSource(c.MetricsTLSConfig, rc, "cert-manager-cainjector")
	if certs != nil {
		suites, err := cliflag.TLSCipherSuites(c.MetricsTLSConfig.CipherSuites)
		if err != nil {
			return err
		}
		minVersion, err := cliflag.TLSVersion(c.MetricsTLSConfig.MinTLSVersion)
		if err != nil {
			return err
		}
		metrics.SecureServing = true
		metrics.TLSOpts = []func(*tls.Config){func(t *tls.Config) {
			t.CipherSuites, t.MinVersion, t.GetCertificate = suites, minVersion, certs.GetCertificate
		}}
	}
	var namespaces map[string]cache.Config
	if c.Namespace != "" {
		namespaces = map[string]cache.Config{c.Namespace: {}}
	}
	le := c.LeaderElectionConfig
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme: scheme,
		Cache:  cache.Options{ReaderFailOnMissingInformer: true, DefaultNamespaces: namespaces},
		// Secrets are read directly, not cached: the injector only watches
		// their metadata, and a cluster may hold many large Secrets.
		Client:                        client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		LeaderElection:                le.Enabled,
		LeaderElectionNamespace:       le.Namespace,
		LeaderElectionID:              "cert-manager-cainjector-leader-election",
		LeaderElectionReleaseOnCancel: true,
		LeaderElectionResourceLock:    resourcelock.LeasesResourceLock,
		LeaderElectionLabels:          map[string]string{"app.kubernetes.io/managed-by": "cert-manager-cainjector"},
		LeaseDuration:                 &le.LeaseDuration,
		RenewDeadline:                 &le.RenewDeadline,
		RetryPeriod:                   &le.RetryPeriod,
		Metrics:                       metrics,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if certs != nil {
		if err := mgr.Add(certs); err != nil {
			return err
		}
	}
	if c.EnableDataSourceConfig.Certificates {
		// Watching Certificates needs their CRD: wait for it (as upstream
		// does) rather than fail when started together with the CRDs.
		gk := schema.GroupKind{Group: "cert-manager.io", Kind: "Certificate"}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(context.Context) (bool, error) {
			_, err := mgr.GetRESTMapper().RESTMapping(gk, "v1")
			if err != nil {
				logf.FromContext(ctx).Info("waiting for the Certificate CRD", "error", err.Error())
			}
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("certificates.cert-manager.io CRD: %w", err)
		}
	}
	inj := c.EnableInjectableConfig
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    c.Namespace,
		IgnoreNamespaces:             c.IgnoreNamespaces,
		EnableCertificatesDataSource: c.EnableDataSourceConfig.Certificates,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   inj.MutatingWebhookConfigurations,
			cainjector.ValidatingWebhookConfigurationName: inj.ValidatingWebhookConfigurations,
			cainjector.APIServiceName:                     inj.APIServices,
			cainjector.CustomResourceDefinitionName:       inj.CustomResourceDefinitions,
		},
	})
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
