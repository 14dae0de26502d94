// Package vcert is a stand-in: see go.mod. NewClient always fails.
package vcert

import (
	"net/http"

	"github.com/Venafi/vcert/v5/pkg/endpoint"
)

// Config holds the fields cert-manager sets.
type Config struct {
	ConnectorType   endpoint.ConnectorType
	BaseUrl         string
	Zone            string
	LogVerbose      bool
	ConnectionTrust string
	Credentials     *endpoint.Authentication
	Client          *http.Client
}

// NewClient fails: there is no Venafi support in this build.
func NewClient(*Config, ...any) (endpoint.Connector, error) { return nil, endpoint.ErrNotBuilt }
