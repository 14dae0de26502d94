// Package fake is a stand-in: see the module's go.mod. Every call fails.
package fake

import "github.com/Venafi/vcert/v5/pkg/endpoint"

type Connector struct{ endpoint.Failing }

var _ endpoint.Connector = (*Connector)(nil)

func (*Connector) GetType() endpoint.ConnectorType { return endpoint.ConnectorTypeFake }

func NewConnector(bool, any) *Connector { return &Connector{} }
