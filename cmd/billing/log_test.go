package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/config"
)

// TestNewLogger: both formats write durations as text, wherever they are
// in a line, and LOG_FORMAT picks the format.
func TestNewLogger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		format string
		want   []string
	}{
		{"OK_JSON", config.LogJSON, []string{`"retry_in":"1.36s"`, `"drain_timeout":"10s"`, `"retention":"168h0m0s"`, `"short":"12.35ms"`, `"tiny":"750ns"`, `"count":3`}},
		{"OK_Text", config.LogText, []string{`retry_in=1.36s`, `cfg.drain_timeout=10s`, `cfg.retention=168h0m0s`, `short=12.35ms`, `tiny=750ns`, `count=3`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			log := newLogger(&buf, config.Log{Level: slog.LevelInfo, Format: tt.format})
			log.Warn("retrying messages", "retry_in", 1357137935*time.Nanosecond, "count", 3,
				slog.Group("cfg", slog.Duration("drain_timeout", 10*time.Second), "retention", 168*time.Hour),
				"short", 12345600*time.Nanosecond, "tiny", 750*time.Nanosecond)
			log.Debug("below the level")
			out := buf.String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("log line lacks %s:\n%s", w, out)
				}
			}
			if strings.Contains(out, "below the level") {
				t.Errorf("a debug line was written at info:\n%s", out)
			}
			if isJSON := json.Valid([]byte(strings.TrimSpace(out))); isJSON != (tt.format == config.LogJSON) {
				t.Errorf("LOG_FORMAT=%s wrote JSON = %v:\n%s", tt.format, isJSON, out)
			}
		})
	}
}

func TestRoughly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want time.Duration
	}{
		{1357137935 * time.Nanosecond, 1360 * time.Millisecond},
		{168 * time.Hour, 168 * time.Hour},
		{-2345678901 * time.Nanosecond, -2350 * time.Millisecond},
		{12345600 * time.Nanosecond, 12350 * time.Microsecond},
		{999 * time.Microsecond, 999 * time.Microsecond},
		{0, 0},
	}
	for _, tt := range tests {
		if got := roughly(tt.in); got != tt.want {
			t.Errorf("roughly(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
