package runner

// SetHold makes every unary gRPC call of a Service started with c run
// hold before its handler, so that a test can keep a call under way.
func SetHold(c *Config, hold func()) { c.hold = hold }
