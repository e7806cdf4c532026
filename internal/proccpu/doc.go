// Package proccpu reads the CPU time the process has used, for the
// benchmarks' figures of a decision's cost to its host.
package proccpu
