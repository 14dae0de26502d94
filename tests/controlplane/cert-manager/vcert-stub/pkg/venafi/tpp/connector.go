// Package tpp is a stand-in: see the module's go.mod. Every call fails.
package tpp

import (
	"github.com/Venafi/vcert/v5/pkg/certificate"
	"github.com/Venafi/vcert/v5/pkg/endpoint"
)

type Connector struct{ endpoint.Failing }

var _ endpoint.Connector = (*Connector)(nil)

func (*Connector) GetType() endpoint.ConnectorType { return endpoint.ConnectorTypeTPP }

type OauthGetRefreshTokenResponse struct {
	Access_token, Refresh_token string
	Expires                     int
}

type OauthVerifyTokenResponse struct{ Identity string }

func (*Connector) GetRefreshToken(*endpoint.Authentication) (OauthGetRefreshTokenResponse, error) {
	return OauthGetRefreshTokenResponse{}, endpoint.ErrNotBuilt
}

func (*Connector) VerifyAccessToken(*endpoint.Authentication) (OauthVerifyTokenResponse, error) {
	return OauthVerifyTokenResponse{}, endpoint.ErrNotBuilt
}

func (*Connector) ResetCertificate(*certificate.Request, bool) error { return endpoint.ErrNotBuilt }

type ErrCertNotFound struct{}

func (*ErrCertNotFound) Error() string { return "certificate not found" }
