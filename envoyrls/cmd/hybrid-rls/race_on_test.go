//go:build race

package main

// buildFlags are the flags the command is built with: those of the test,
// so that the build reuses the packages the test compiled.
var buildFlags = []string{"-race"}
