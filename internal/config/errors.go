package config

import (
	"fmt"
	"slices"
	"strings"
)

// VarError is a bad configuration value; it names the variable.
type VarError struct {
	Var string
	Err error
}

func (e *VarError) Error() string { return "config: " + e.Var + ": " + e.Err.Error() }
func (e *VarError) Unwrap() error { return e.Err }

// Errors is every bad variable of a configuration, at most one error per
// variable.
type Errors []*VarError

// Error lists the variables one per line, so that an operator fixes them
// all in one go.
func (e Errors) Error() string {
	if len(e) == 1 {
		return e[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %d variables are missing or bad:", len(e))
	for _, v := range e {
		b.WriteString("\n  " + v.Var + ": " + v.Err.Error())
	}
	return b.String()
}

// Unwrap gives errors.As and errors.Is each variable's error.
func (e Errors) Unwrap() []error {
	errs := make([]error, len(e))
	for i, v := range e {
		errs[i] = v
	}
	return errs
}

// Vars returns the names of the variables at fault, in order.
func (e Errors) Vars() []string {
	names := make([]string, len(e))
	for i, v := range e {
		names[i] = v.Var
	}
	return names
}

// tidy keeps the first error of each variable, in the order cfg declares
// them, and returns nil when there is none. A value that could not be read
// leaves its field zero, which Validate would report a second time. A
// variable whose value came from its earlier name (earlier: new name →
// earlier name) is named as the operator wrote it.
func (e Errors) tidy(cfg any, earlier map[string]string) error {
	if len(e) == 0 {
		return nil
	}
	order := map[string]int{}
	for i, v := range Vars(cfg) {
		order[v.Name] = i
	}
	rank := func(name string) int {
		if i, ok := order[name]; ok {
			return i
		}
		return len(order) // a variable Validate names that cfg does not read
	}
	seen := map[string]bool{}
	var out Errors
	for _, v := range e {
		if !seen[v.Var] {
			seen[v.Var] = true
			out = append(out, v)
		}
	}
	slices.SortStableFunc(out, func(a, b *VarError) int { return rank(a.Var) - rank(b.Var) })
	for _, v := range out {
		if old, ok := earlier[v.Var]; ok {
			v.Var = old
		}
	}
	return out
}

// add records a problem with variable name.
func (e *Errors) add(name, format string, args ...any) {
	*e = append(*e, &VarError{Var: name, Err: fmt.Errorf(format, args...)})
}

// err returns the problems as an error, nil when there are none.
func (e Errors) err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}
