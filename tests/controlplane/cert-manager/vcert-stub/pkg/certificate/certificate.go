// Package certificate is a stand-in: see the module's go.mod.
package certificate

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"time"

	"github.com/Venafi/vcert/v5/pkg/util"
)

type (
	CustomFieldType int
	CSrOriginOption int
	ChainOption     int
)

const (
	CustomFieldPlain CustomFieldType = iota
	CustomFieldOrigin
)

const (
	LocalGeneratedCSR CSrOriginOption = iota
	ServiceGeneratedCSR
	UserProvidedCSR
)

const (
	ChainOptionRootLast ChainOption = iota
	ChainOptionRootFirst
	ChainOptionIgnore
)

type CustomField struct {
	Type        CustomFieldType
	Name, Value string
}

// Request holds the fields cert-manager sets.
type Request struct {
	Subject          pkix.Name
	DNSNames         []string
	FriendlyName     string
	PickupID         string
	Timeout          time.Duration
	ValidityDuration *time.Duration
	IssuerHint       util.IssuerHint
	ChainOption      ChainOption
	CsrOrigin        CSrOriginOption
	CustomFields     []CustomField
	csr              []byte
}

func NewRequest(cert *x509.Certificate) *Request {
	return &Request{Subject: cert.Subject, DNSNames: cert.DNSNames}
}

func (r *Request) SetCSR(csr []byte) error { r.csr = csr; return nil }

type PEMCollection struct {
	Certificate string
	PrivateKey  string
	Chain       []string
}
