// Package endpoint is a stand-in: see the module's go.mod.
package endpoint

import (
	"errors"

	"github.com/Venafi/vcert/v5/pkg/certificate"
)

// ErrNotBuilt is what every stand-in operation returns.
var ErrNotBuilt = errors.New("Venafi issuers are not supported by this cert-manager build (github.com/Venafi/vcert/v5 is a stand-in)")

type ConnectorType int

const (
	ConnectorTypeUndefined ConnectorType = iota
	ConnectorTypeFake
	ConnectorTypeCloud
	ConnectorTypeTPP
	ConnectorTypeFirefly
	ConnectorTypeNGTS
)

// Connector is the part of vcert's connector interface cert-manager uses.
type Connector interface {
	GetType() ConnectorType
	Ping() error
	ReadZoneConfiguration() (*ZoneConfiguration, error)
	RequestCertificate(*certificate.Request) (string, error)
	RetrieveCertificate(*certificate.Request) (*certificate.PEMCollection, error)
}

type Authentication struct {
	User, Password, APIKey, AccessToken, RefreshToken string
	ClientId, ClientSecret, Scope, TokenURL           string
}

type ZoneConfiguration struct{}

func (*ZoneConfiguration) UpdateCertificateRequest(*certificate.Request) {}

func (*ZoneConfiguration) ValidateCertificateRequest(*certificate.Request) error { return ErrNotBuilt }

type ErrCertificatePending struct{ CertificateID, Status string }

func (e ErrCertificatePending) Error() string { return "certificate pending: " + e.Status }

type ErrRetrieveCertificateTimeout struct{ CertificateID string }

func (e ErrRetrieveCertificateTimeout) Error() string { return "certificate retrieval timed out" }

// Failing answers every call of a connector with ErrNotBuilt; each connector
// package embeds it beside its own GetType.
type Failing struct{}

func (Failing) Ping() error                        { return ErrNotBuilt }
func (Failing) Authenticate(*Authentication) error { return ErrNotBuilt }
func (Failing) ReadZoneConfiguration() (*ZoneConfiguration, error) {
	return nil, ErrNotBuilt
}
func (Failing) RequestCertificate(*certificate.Request) (string, error) { return "", ErrNotBuilt }
func (Failing) RetrieveCertificate(*certificate.Request) (*certificate.PEMCollection, error) {
	return nil, ErrNotBuilt
}
