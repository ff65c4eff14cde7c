// Package tracing sets up OpenTelemetry tracing for billing.
//
// Tracing is off unless OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set: then spans are exported over
// OTLP/HTTP, and the standard OTEL_* variables (OTEL_SERVICE_NAME,
// OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_HEADERS, ...) apply. Off, the
// provider is a no-op that costs next to nothing per event, while trace
// context still flows through Kafka headers and HTTP calls so that logs can
// name the producer's trace id.
//
// The provider is returned to the caller and passed to each component,
// never installed as OpenTelemetry's global.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Propagator carries trace context in W3C traceparent/tracestate headers,
// in Kafka records and HTTP requests alike.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// Enabled reports whether environ asks for tracing.
func Enabled(environ map[string]string) bool {
	if strings.EqualFold(environ["OTEL_SDK_DISABLED"], "true") {
		return false
	}
	return environ["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != ""
}

// NewProvider returns the tracer provider environ asks for and a function
// that flushes and stops it.
func NewProvider(ctx context.Context, environ map[string]string, version string) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled(environ) {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	if u := environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]; u != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	} else {
		opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimRight(environ["OTEL_EXPORTER_OTLP_ENDPOINT"], "/")+"/v1/traces"))
	}
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	name := environ["OTEL_SERVICE_NAME"]
	if name == "" {
		name = "billing"
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Traceparent is the W3C traceparent header of sc, "" when sc is not valid:
// what a record written now carries so that its consumer joins sc's trace.
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	Propagator().Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}
