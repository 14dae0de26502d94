// Package verror is a stand-in: see the module's go.mod.
package verror

import "errors"

var ServerUnavailableError = errors.New("server unavailable")
