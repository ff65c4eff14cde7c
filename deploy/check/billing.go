// Package check keeps billing's deployment files — Dockerfile,
// docker-compose.yml, the Kubernetes manifests under deploy/ and the Grafana
// dashboard — true to the binary they deploy, offline: no Docker engine and
// no cluster needed. Its tests (run by `make test`) derive what billing is
// from its source (subcommands and flags from cmd/billing, environment
// variables from internal/config's struct tags, metric names from
// internal/metrics) and fail when a deployment file drifts from it.
//
// It is a module of its own, so that compose-go, kustomize and k8s.io stay
// out of the service's go.mod.
package check

import (
	"database/sql"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"example.com/billing/internal/config"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
)

// root is the repository root, relative to this package's directory (where
// `go test` runs).
const root = "../.."

// path returns a repository path.
func path(elem ...string) string { return filepath.Join(append([]string{root}, elem...)...) }

// Binary is what billing's source says the binary does and reads.
type Binary struct {
	// Commands are the words `billing <command>` dispatches on, in the
	// developer build, which has every command: the names and aliases of
	// cmd/billing's tables of subcommands.
	Commands map[string]bool
	// Developer are the commands of the developer build (the tag dev)
	// only, which the image that ships does not have.
	Developer map[string]bool
	// Flags holds each command's flag names, from the flag sets cmd/billing
	// builds with newFlagSet (or flag.NewFlagSet) and the flags defined on
	// them.
	Flags map[string]map[string]bool
	// ServeVars are the variables `billing serve` reads: the env tags of
	// config.Serve.
	ServeVars map[string]bool
	// DirectVars are read as environ["NAME"] in cmd/billing or internal/.
	DirectVars map[string]bool
	// AllVars are the variables any command reads: every env tag in
	// internal/config, every DirectVar, and the Go runtime's own.
	AllVars map[string]bool
	// Metrics are the series names billing exports: its own collectors
	// (internal/metrics) and the standard ones serve registers.
	Metrics map[string]bool
}

// runtimeVars are read by the Go runtime, not by billing's code.
var runtimeVars = []string{"GOMEMLIMIT", "GOMAXPROCS", "GOGC", "GODEBUG", "TZ"}

// sdkPrefix marks the OpenTelemetry SDK's standard variables, which it reads
// from the process environment (internal/tracing).
const sdkPrefix = "OTEL_"

// Reads reports whether billing reads name; with serve, whether
// `billing serve` does.
func (b *Binary) Reads(cmd, name string) bool {
	if slices.Contains(runtimeVars, name) || strings.HasPrefix(name, sdkPrefix) || b.DirectVars[name] {
		return true
	}
	if cmd == "serve" {
		return b.ServeVars[name]
	}
	return b.AllVars[name]
}

// SecretVars are the contract's secrets: they come from a Secret in
// Kubernetes and never appear in a ConfigMap.
var SecretVars = []string{"DATABASE_URL", "PAYMENT_API_KEY", "PAYMENT_WEBHOOK_SECRET", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"}

// LoadBinary reads the facts from the repository's source.
func LoadBinary() (*Binary, error) {
	b := &Binary{
		ServeVars: ServeVars(),
		AllVars:   map[string]bool{},
	}
	var err error
	if b.Commands, b.Developer, b.Flags, err = commandsAndFlags(path("cmd", "billing")); err != nil {
		return nil, err
	}
	configVars, err := envTags(path("internal", "config"))
	if err != nil {
		return nil, err
	}
	// Variables read straight from the environment map, by the commands
	// and by packages such as internal/tracing.
	b.DirectVars = map[string]bool{}
	dirs, err := filepath.Glob(path("internal", "*"))
	if err != nil {
		return nil, err
	}
	for _, dir := range append(dirs, path("cmd", "billing")) {
		vars, err := environIndexes(dir)
		if err != nil {
			return nil, err
		}
		for v := range vars {
			b.DirectVars[v] = true
		}
	}
	for _, set := range []map[string]bool{b.ServeVars, configVars, b.DirectVars} {
		for v := range set {
			b.AllVars[v] = true
		}
	}
	for _, v := range runtimeVars {
		b.AllVars[v] = true
	}
	if b.Metrics, err = exportedMetrics(); err != nil {
		return nil, err
	}
	return b, nil
}

// ServeVars walks config.Serve's struct tags (`env:"NAME,..."`) as
// config.Load does: nested structs without a tag are walked into.
func ServeVars() map[string]bool { return structVars(reflect.TypeFor[config.Serve]()) }

// CommandVars returns the variables cmd's configuration reads, or nil when
// deploy/check does not know which configuration cmd loads.
func CommandVars(cmd string) map[string]bool {
	cfg := configFor(cmd)
	if cfg == nil {
		return nil
	}
	return structVars(reflect.TypeOf(cfg).Elem())
}

func structVars(rt reflect.Type) map[string]bool {
	vars := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("env")
			if f.Type.Kind() == reflect.Struct && tag == "" && f.Type != reflect.TypeFor[time.Time]() {
				walk(f.Type)
				continue
			}
			if name, _, _ := strings.Cut(tag, ","); name != "" {
				vars[name] = true
			}
		}
	}
	walk(rt)
	return vars
}

// goFiles parses the non-test Go files of dir, of every build.
func goFiles(dir string) ([]*ast.File, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// shipped reports whether f is in the build that ships: on Linux, with no
// tag (make build, the Dockerfile's image).
func shipped(f *ast.File) (bool, error) {
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false, err
			}
			return expr.Eval(func(tag string) bool { return tag == "linux" || tag == "amd64" || tag == "unix" }), nil
		}
	}
	return true, nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// flagDefiners are the flag.FlagSet methods that define a flag, and the
// index of the flag's name among their arguments.
var flagDefiners = map[string]int{
	"Bool": 0, "Duration": 0, "Float64": 0, "Int": 0, "Int64": 0, "String": 0, "Uint": 0, "Uint64": 0,
	"Func": 0, "BoolFunc": 0,
	"BoolVar": 1, "DurationVar": 1, "Float64Var": 1, "IntVar": 1, "Int64Var": 1, "StringVar": 1,
	"UintVar": 1, "Uint64Var": 1, "TextVar": 1, "Var": 1,
}

// commandsAndFlags finds the names and aliases of the tables of
// subcommands ([]subcommand{{name: ...}}), those in files of the developer
// build only, and the flags of every flag set created in cmd/billing.
func commandsAndFlags(dir string) (commands, developer map[string]bool, flags map[string]map[string]bool, err error) {
	files, err := goFiles(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	commands, developer, flags = map[string]bool{}, map[string]bool{}, map[string]map[string]bool{}
	shippedNames := map[string]bool{}
	for _, f := range files {
		ships, err := shipped(f)
		if err != nil {
			return nil, nil, nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				for _, name := range subcommandNames(n) {
					commands[name] = true
					shippedNames[name] = shippedNames[name] || ships
				}
				return true
			})
			// A function that creates a flag set for a command defines that
			// command's flags.
			cmd := ""
			var defined []string
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				var name string
				switch fun := call.Fun.(type) {
				case *ast.Ident:
					name = fun.Name
				case *ast.SelectorExpr:
					name = fun.Sel.Name
				}
				if (name == "newFlagSet" || name == "NewFlagSet") && len(call.Args) > 0 {
					if s, ok := stringLit(call.Args[0]); ok {
						cmd = s
					}
				}
				if i, ok := flagDefiners[name]; ok && len(call.Args) > i {
					if _, isSel := call.Fun.(*ast.SelectorExpr); isSel {
						if s, ok := stringLit(call.Args[i]); ok {
							defined = append(defined, s)
						}
					}
				}
				return true
			})
			if cmd != "" {
				if flags[cmd] == nil {
					flags[cmd] = map[string]bool{}
				}
				for _, fl := range defined {
					flags[cmd][fl] = true
				}
				flags[cmd]["h"], flags[cmd]["help"] = true, true
			}
		}
	}
	if len(commands) == 0 {
		return nil, nil, nil, fmt.Errorf("%s: no table of subcommands ([]subcommand{...}); update deploy/check", dir)
	}
	for name := range commands {
		if !shippedNames[name] {
			developer[name] = true
		}
	}
	return commands, developer, flags, nil
}

// subcommandNames returns the names and aliases of the entries of n when n
// is a table of subcommands, []subcommand{{name: "serve", ...}, ...}.
func subcommandNames(n ast.Node) []string {
	table, ok := n.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	typ, ok := table.Type.(*ast.ArrayType)
	if !ok {
		return nil
	}
	if elt, ok := typ.Elt.(*ast.Ident); !ok || elt.Name != "subcommand" {
		return nil
	}
	var names []string
	for _, e := range table.Elts {
		entry, ok := e.(*ast.CompositeLit)
		if !ok {
			continue
		}
		for _, f := range entry.Elts {
			kv, ok := f.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			switch key, _ := kv.Key.(*ast.Ident); {
			case key == nil:
			case key.Name == "name":
				if s, ok := stringLit(kv.Value); ok {
					names = append(names, s)
				}
			case key.Name == "aliases":
				if list, ok := kv.Value.(*ast.CompositeLit); ok {
					for _, a := range list.Elts {
						if s, ok := stringLit(a); ok {
							names = append(names, s)
						}
					}
				}
			}
		}
	}
	return names
}

// envTags returns every `env:"NAME..."` struct tag in dir's Go files.
func envTags(dir string) (map[string]bool, error) {
	files, err := goFiles(dir)
	if err != nil {
		return nil, err
	}
	vars := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			field, ok := n.(*ast.Field)
			if !ok || field.Tag == nil {
				return true
			}
			tag, err := strconv.Unquote(field.Tag.Value)
			if err != nil {
				return true
			}
			if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("env"), ","); name != "" {
				vars[name] = true
			}
			return true
		})
	}
	return vars, nil
}

var varName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// environIndexes returns the NAME of every environ["NAME"] in dir: the
// variables a command reads directly from its environment map.
func environIndexes(dir string) (map[string]bool, error) {
	files, err := goFiles(dir)
	if err != nil {
		return nil, err
	}
	vars := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ix, ok := n.(*ast.IndexExpr)
			if !ok {
				return true
			}
			if id, ok := ix.X.(*ast.Ident); ok && id.Name == "environ" {
				if s, ok := stringLit(ix.Index); ok && varName.MatchString(s) {
					vars[s] = true
				}
			}
			return true
		})
	}
	return vars, nil
}

// The series of a histogram and of a summary, after the metric's name.
var (
	histogramSuffixes = []string{"_bucket", "_sum", "_count"}
	summarySuffixes   = []string{"", "_sum", "_count"}
)

// describer is a prometheus.Registerer that records the series names of the
// collectors registered with it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	suffixes := []string{""}
	switch c.(type) {
	case *prometheus.HistogramVec:
		suffixes = histogramSuffixes
	case *prometheus.SummaryVec:
		suffixes = summarySuffixes
	default:
		// A plain metric shows its type when written out (prometheus.Histogram
		// and prometheus.Summary are the same interface).
		mc := make(chan prometheus.Metric, 64)
		go func() { c.Collect(mc); close(mc) }()
		for m := range mc {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				return err
			}
			switch {
			case pb.Histogram != nil:
				suffixes = histogramSuffixes
			case pb.Summary != nil:
				suffixes = summarySuffixes
			}
		}
	}
	for desc := range ch {
		m := fqName.FindStringSubmatch(desc.String())
		if m == nil {
			return fmt.Errorf("cannot read the name of %s", desc)
		}
		for _, s := range suffixes {
			d.names[m[1]+s] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// exportedMetrics lists billing's own series (internal/metrics) and those of
// the standard collectors serve registers: Go runtime, process, and the
// database pool (go_sql_*{db_name="billing"}).
func exportedMetrics() (map[string]bool, error) {
	d := &describer{names: map[string]bool{}}
	metrics.New(d)

	reg := prometheus.NewRegistry()
	db, err := postgres.Open("postgres://billing@127.0.0.1:1/billing?sslmode=disable", 1)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var sqlDB *sql.DB = db.DB
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewDBStatsCollector(sqlDB, "billing"))
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	for _, f := range families {
		name := f.GetName()
		suffixes := []string{""}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			suffixes = histogramSuffixes
		case dto.MetricType_SUMMARY:
			suffixes = summarySuffixes
		}
		for _, s := range suffixes {
			d.names[name+s] = true
		}
	}
	return d.names, nil
}

// port returns the port of a [host]:port address such as HTTP_ADDR.
func port(addr string) (int, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return 0, fmt.Errorf("%q has no port", addr)
	}
	return strconv.Atoi(addr[i+1:])
}

// sortedKeys returns m's keys in order, for messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// exists reports whether a file or directory exists.
func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// configFor returns the configuration a command loads at start, for
// ValidateConfig; nil for commands configured by flags only.
func configFor(cmd string) config.Validator {
	switch cmd {
	case "serve":
		return &config.Serve{}
	case "migrate":
		return &config.Migrate{}
	case "maintain":
		return &config.Maintain{}
	case "produce", "devkafka":
		return &config.Kafka{}
	}
	return nil
}

// fileVars name files that exist only where billing is deployed (mounted
// Secrets); ValidateConfig points them at a file that exists here.
var fileVars = []string{"KAFKA_TLS_CA_FILE", "KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"}

// ValidateConfig runs billing's own configuration loading and validation
// (config.Load) on env, as cmd does at start.
func ValidateConfig(cmd string, env map[string]string, anyFile string) error {
	cfg := configFor(cmd)
	if cfg == nil {
		return nil
	}
	e := make(map[string]string, len(env))
	for k, v := range env {
		e[k] = v
	}
	for _, v := range fileVars {
		if e[v] != "" {
			e[v] = anyFile
		}
	}
	return config.Load(e, cfg)
}
