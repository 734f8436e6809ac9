//go:build ebb_image

package main

import (
	"github.com/spf13/cobra"

	// The image carries no CA bundle of its own: the binary embeds Mozilla's
	// roots from a pinned module (go.sum holds its hash), used when the
	// host gives none (the image's case; a bundle mounted at a standard
	// path, or SSL_CERT_FILE, still wins). Roots with constraints (a
	// distrust date) keep them, which a PEM file could not.
	_ "golang.org/x/crypto/x509roots/fallback"
)

// developerCommands: none in the image (see developer.go).
func developerCommands() []*cobra.Command { return nil }

func exitCode(error) (int, bool) { return 0, false }
