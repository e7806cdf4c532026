package windows

import _ "embed"

// The scripts, each documented in its header comment.
var (
	//go:embed fixed.lua
	fixedLua string
	//go:embed log.lua
	logLua string
	//go:embed counter.lua
	counterLua string
)
