// Command webhook is cert-manager's admission webhook (validation, mutation,
// CertificateRequest identity and approval checks) wired from the main
// module: the flags are cert-manager's own (pkg/webhook/options), so the Helm
// chart's arguments are accepted as they are, and with the chart's
// --dynamic-serving-* flags it serves TLS from a self-signed CA that it keeps
// in a Secret, which cainjector then copies into the webhook configurations.
package main

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"

	config "github.com/cert-manager/cert-manager/internal/apis/config/webhook"
	"github.com/cert-manager/cert-manager/internal/apis/config/webhook/validation"
	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	webhookconfigfile "github.com/cert-manager/cert-manager/pkg/webhook/configfile"
	"github.com/cert-manager/cert-manager/pkg/webhook/options"

	"github.com/cert-manager/cert-manager/captf-build/internal/boot"
)

func main() {
	boot.Main(boot.Component[config.WebhookConfiguration]{
		Name:  "webhook",
		New:   options.NewWebhookConfiguration,
		Flags: options.AddConfigFlags,
		File: func() (configfile.ConfigFile, func() *config.WebhookConfiguration) {
			f := webhookconfigfile.New()
			return f, func() *config.WebhookConfiguration { return f.Config }
		},
		Gates:   func(c *config.WebhookConfiguration) map[string]bool { return c.FeatureGates },
		Logging: func(c *config.WebhookConfiguration) *logsapi.LoggingConfiguration { return &c.Logging },
		Validate: func(c *config.WebhookConfiguration) field.ErrorList {
			return validation.ValidateWebhookConfiguration(c, nil)
		},
		Run: run,
	})
}

func run(ctx context.Context, c *config.WebhookConfiguration) error {
	c.KubeConfig = boot.KubeConfig(c.KubeConfig)
	srv, err := cmwebhook.NewCertManagerWebhookServer(logf.FromContext(ctx), *c)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
