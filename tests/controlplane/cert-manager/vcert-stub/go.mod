// A stand-in for github.com/Venafi/vcert/v5, which cert-manager v1.21.2
// requires at v5.13.7: the module proxy refuses that version (403 "This module
// version is not available"; v5.13.x and v5.14.0 likewise), and v5.12.x lacks
// pkg/venafi/ngts that cert-manager's Venafi client imports. cert-manager
// links its Venafi issuer into every controller (the controller defaults list
// it), so this module supplies the API surface that code compiles against;
// every connector fails with ErrNotBuilt, so a Venafi Issuer reports that
// error and everything else is unaffected.
module github.com/Venafi/vcert/v5

go 1.26.0
