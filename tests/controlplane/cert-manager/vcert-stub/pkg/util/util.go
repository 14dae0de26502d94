// Package util is a stand-in: see the module's go.mod.
package util

type IssuerHint int

const (
	IssuerHintGeneric IssuerHint = iota
	IssuerHintMicrosoft
	IssuerHintDigicert
	IssuerHintEntrust
	IssuerHintAllIssuers
)
