# billing — make targets. `make demo` and `make test` are the two commands a
# newcomer needs; CI runs `make ci`.

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
BIN       := bin/billing

.PHONY: build test test-short lint vet staticcheck fmt-check vuln clean

## build: the static billing binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/billing

## test: every test, with the race detector, against the local PostgreSQL
test:
	$(GO) test -race -count=1 -timeout 20m ./...

## test-short: unit tests only (no database, no broker)
test-short:
	$(GO) test -short -count=1 ./...

## lint: formatting, go vet and staticcheck
lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# The tools are pinned in tools/go.mod, apart from the service's modules.
bin/staticcheck bin/govulncheck: tools/go.mod
	cd tools && $(GO) build -o ../bin/ honnef.co/go/tools/cmd/staticcheck golang.org/x/vuln/cmd/govulncheck

staticcheck: bin/staticcheck
	bin/staticcheck ./...

## vuln: known vulnerabilities (needs access to vuln.go.dev)
vuln: bin/govulncheck
	bin/govulncheck ./...

clean:
	rm -rf bin
