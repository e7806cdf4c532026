package runner

import (
	"io"
	"log/slog"
	"time"
)

// NewLogger returns a logger that writes to w at c.LogLevel and above: text
// lines, or with c.LogJSON JSON lines with the original's field names
// ("@timestamp", "@message", and level as logrus spells it: "debug",
// "info", "warning", "error"), so that a log pipeline built for the
// original reads them.
func (c *Config) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if !c.LogJSON {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.TimeKey:
			return slog.String("@timestamp", a.Value.Time().UTC().Format(time.RFC3339Nano))
		case slog.MessageKey:
			a.Key = "@message"
		case slog.LevelKey:
			return slog.String("level", levelName(a.Value.Any().(slog.Level)))
		}
		return a
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// levelName names l as logrus does.
func levelName(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warning"
	}
	return "error"
}
