package config

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Var is one environment variable of a configuration, as its struct tags
// describe it.
type Var struct {
	Name string
	// Default is the value used when the variable is not set; "" for none.
	Default string
	// Required variables have no default: a command does not start
	// without them.
	Required bool
	// Help is the one-line meaning.
	Help string
}

// Vars lists the variables cfg (a configuration struct or a pointer to one)
// reads, in the order of its fields.
func Vars(cfg any) []Var {
	var vars []Var
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) {
		_, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
		vars = append(vars, Var{
			Name:     name,
			Default:  f.Tag.Get("envDefault"),
			Required: slices.Contains(strings.Split(opts, ","), "required"),
			Help:     f.Tag.Get("help"),
		})
	})
	return vars
}

// emptyButSet rejects a variable marked notEmpty that is set to "". The env
// library would quietly use the default, but an operator who wrote
// KAFKA_BROKERS= made a mistake worth stopping for.
func emptyButSet(environ map[string]string, cfg any) Errors {
	var errs Errors
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) {
		if v, ok := environ[name]; ok && strings.TrimSpace(v) == "" && f.Tag.Get("notEmpty") == "true" {
			errs.add(name, "is set but empty")
		}
	})
	return errs
}

// nameVariables rewrites the env library's errors, which name Go fields, so
// that they name the environment variable the operator must fix.
func nameVariables(err error, cfg any) Errors {
	byField := map[string]string{}
	walkFields(reflect.TypeOf(cfg), func(f reflect.StructField, name string) { byField[f.Name] = name })
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		agg.Errors = []error{err}
	}
	var errs Errors
	for _, e := range agg.Errors {
		var pe env.ParseError
		var ns env.VarIsNotSetError
		switch {
		case errors.As(e, &pe):
			errs = append(errs, &VarError{Var: byField[pe.Name], Err: pe.Err})
		case errors.As(e, &ns):
			errs.add(ns.Key, "is required")
		default:
			errs.add("?", "%w", e)
		}
	}
	return errs
}

func walkFields(t reflect.Type, fn func(f reflect.StructField, name string)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Tag.Get("env") == "" && f.Type != reflect.TypeOf(time.Time{}) {
			walkFields(f.Type, fn)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			fn(f, name)
		}
	}
}
