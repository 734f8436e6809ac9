//go:build ebb_image

package main

import "github.com/spf13/cobra"

// developerCommands: none in the image (see developer.go).
func developerCommands() []*cobra.Command { return nil }

func exitCode(error) (int, bool) { return 0, false }
