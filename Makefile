# billing — make targets. `make demo` and `make test` are the two commands a
# newcomer needs; CI runs `make ci`; `make help` lists the targets.

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
BIN       := bin/billing
DEV_BIN   := bin/dev/billing

.PHONY: help ci build dev demo test test-kfake kafka bench lint vet staticcheck fmt-check vuln clean bench-dedup lint-migrations squawk stripe-mock walk

## help: the targets and what they do (from the Makefile's ## comments)
help:
	@awk '/^## [a-z-]+:/ { sub(/^## /, ""); print; next } /^## / { sub(/^## /, "    "); print }' $(MAKEFILE_LIST)

## ci: what CI runs on a clean clone (.ci/run): PostgreSQL, make kafka, make
## squawk, make stripe-mock, make lint, make test, make test-kfake, make fuzz
## and make chaos, with each stage's time (docs/testing.md)
ci:
	bash .ci/run

## build: the static billing binary that ships, in bin/ (the image's): the
## service and its operators' commands, no developer command
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/billing

## dev: the developer build, bin/dev/billing: make build's commands and the
## developer commands (demo, produce, devkafka, fakepsp), which link a fake
## broker and a fake provider (-tags dev; docs/deployment.md, "What ships")
dev:
	CGO_ENABLED=0 $(GO) build -tags dev -trimpath -ldflags "$(LDFLAGS)" -o $(DEV_BIN) ./cmd/billing

## demo: the whole pipeline on this machine (embedded broker, fake provider,
## the PostgreSQL at DATABASE_URL or one of its own), then a summary;
## DEMO_FLAGS="--keep" leaves it running until Ctrl-C
# The built binary, not `go run`: go run exits 1 when interrupted even when
# the program exits 0, which turned Ctrl-C of --keep into a make error.
demo: dev
	$(DEV_BIN) demo $(DEMO_FLAGS)

# The tests' PostgreSQL: the server at TEST_DATABASE_URL (127.0.0.1:5432)
# when it answers, else one withpg starts for the whole run, from PG_BIN,
# /usr/lib/postgresql/*/bin or the embedded PostgreSQL (docs/testing.md).
WITHPG := $(GO) run ./internal/dev/pgserver/cmd/withpg

## test: every test, with the race detector, in the developer build (which
## has every command), against the PostgreSQL at TEST_DATABASE_URL or one
## of their own, and KAFKA_TEST_BROKER (default: Apache Kafka where Java and
## Maven are installed, else the embedded kfake broker; see docs/testing.md)
test:
	$(WITHPG) $(GO) test -tags dev -race -count=1 -timeout 20m ./...
	cd deploy/check && $(GO) test -count=1 ./...

## test-kfake: the tests that talk to a broker, on the embedded kfake broker
KAFKA_PACKAGES := ./cmd/... ./internal/kafka/... ./internal/consumer/... ./internal/testenv/kafkatest/... ./internal/dev/loadgen/...
test-kfake:
	KAFKA_TEST_BROKER=kfake $(WITHPG) $(GO) test -tags dev -race -count=1 -timeout 20m $(KAFKA_PACKAGES)

## kafka: resolve the pinned Apache Kafka (test/kafka/pom.xml) into the cache
## the tests use (~/.cache/billing/kafka-<version>); they do it on first use
kafka:
	$(GO) run ./internal/testenv/apachekafka/cmd/kafkajars

## chaos: the fault-injection suite (docs/testing.md): real serve processes, a
## throwaway PostgreSQL cluster, fakepsp, and a three-broker Apache Kafka
## cluster (~25 min on 2 cores; the default where Java and Maven are
## installed, and under CI=true) or the embedded kfake broker
## (CHAOS_BROKER=kfake, ~8 min). broker-faults runs on kfake only;
## leader-kill-9, coordinator-kill-9, rolling-restart and broker-pause on
## Apache Kafka only. CHAOS_SEED=<n> replays a run, CHAOS_RUN=<scenario> runs
## one scenario
.PHONY: chaos fuzz
chaos:
	$(GO) vet -tags chaos ./chaos/
	$(GO) test -tags chaos -count=1 -v -timeout 30m ./chaos/ $(if $(CHAOS_RUN),-run 'TestChaos/$(CHAOS_RUN)$$')

## fuzz: fuzz the event decoder (order.Parse) for FUZZTIME
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./internal/order -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME)

## lint: formatting, go vet and staticcheck of every build (below), and
## lint-migrations (which installs squawk when it is missing, see below)
lint: fmt-check vet staticcheck lint-migrations

# The builds of this tree that vet and staticcheck check besides a
# release's (no tag): the developer build (dev), the chaos suite's next
# release (upgradetest), the benchmark's seed design (seeddesign) and the
# chaos suite (chaos), on Linux; and a developer's Mac, for the packages
# with files of their own off Linux (*_other.go; the tests build on Linux
# only). deploy/check (make test) fails when a Go file is in none of them.
BUILD_TAGS      := dev upgradetest seeddesign chaos
DARWIN_PACKAGES := ./internal/postgres/ ./internal/dev/pgserver/ ./internal/testenv/pgbouncer/

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## vet: go vet of every build (BUILD_TAGS, DARWIN_PACKAGES) and of deploy/check
vet:
	$(GO) vet ./...
	for tag in $(BUILD_TAGS); do $(GO) vet -tags $$tag ./... || exit 1; done
	GOOS=darwin $(GO) vet $(DARWIN_PACKAGES)
	cd deploy/check && $(GO) vet ./...

# The tools are pinned in tools/go.mod, apart from the service's modules.
bin/staticcheck bin/govulncheck: tools/go.mod
	cd tools && $(GO) build -o ../bin/ honnef.co/go/tools/cmd/staticcheck golang.org/x/vuln/cmd/govulncheck

## staticcheck: staticcheck of every build; -matrix merges them, so that
## what one build alone uses is not reported unused in the others
staticcheck: bin/staticcheck
	printf 'release:\n$(foreach tag,$(BUILD_TAGS),$(tag): -tags=$(tag)\n)' | bin/staticcheck -matrix ./...
	GOOS=darwin bin/staticcheck $(DARWIN_PACKAGES)

# squawk, the migration linter, pinned. From PyPI's squawk-cli: its wheel
# carries the binary and installs with pip alone, where npm's squawk-cli
# lags behind (2.66.0 when 2.70.0 was pinned). It goes into a cache beside
# the Kafka jars', so a fresh clone on the same machine finds it.
SQUAWK_VERSION := 2.70.0
SQUAWK_DIR     := $(HOME)/.cache/billing/squawk-$(SQUAWK_VERSION)
SQUAWK         ?= $(SQUAWK_DIR)/bin/squawk

## squawk: install the pinned squawk (pip, from PyPI) into ~/.cache/billing;
## nothing when it is there
squawk: $(SQUAWK_DIR)/bin/squawk

# Installed beside and then moved, so that an interrupted install leaves
# nothing that looks installed.
$(SQUAWK_DIR)/bin/squawk:
	rm -rf $(SQUAWK_DIR).tmp
	python3 -m pip install --quiet --disable-pip-version-check --no-input --root-user-action=ignore \
		--target $(SQUAWK_DIR).tmp squawk-cli==$(SQUAWK_VERSION)
	rm -rf $(SQUAWK_DIR) && mv $(SQUAWK_DIR).tmp $(SQUAWK_DIR)

# stripe-mock, Stripe's server of its API's shape, pinned: the Stripe
# adapter's shape test (internal/payment/stripe) sends billing's requests to
# it, and its spec's version is the Stripe-Version billing pins. Installed
# where that test looks, the first directory of GOPATH's bin (not GOBIN):
# go install github.com/stripe/stripe-mock@v0.203.0.
STRIPE_MOCK_VERSION := v0.203.0
STRIPE_MOCK_BIN     := $(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin

## stripe-mock: install the pinned stripe-mock (go install, from the Go module
## proxy) into $(go env GOPATH)/bin; nothing when that version is there
stripe-mock:
	@if $(GO) version -m $(STRIPE_MOCK_BIN)/stripe-mock 2>/dev/null | \
		grep -Eq '^[[:space:]]+mod[[:space:]]+github.com/stripe/stripe-mock[[:space:]]+$(STRIPE_MOCK_VERSION)[[:space:]]'; then \
		echo "stripe-mock $(STRIPE_MOCK_VERSION) is installed in $(STRIPE_MOCK_BIN); nothing to do"; \
	else \
		echo "installing stripe-mock $(STRIPE_MOCK_VERSION) into $(STRIPE_MOCK_BIN)"; \
		GOBIN=$(STRIPE_MOCK_BIN) $(GO) install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION); \
	fi

## lint-migrations: db/migrations' Up sections against billing's rules and
## squawk's, less db/migrations/lint-exceptions.md (docs/deployment.md);
## installs the pinned squawk first when it is missing (make squawk)
# It depends on the pinned squawk's file, so that a fresh clone's make lint
# installs it as make kafka installs its jars; a SQUAWK=<path> of the
# user's own is used as it is, never installed over.
lint-migrations: $(if $(filter $(SQUAWK_DIR)/bin/squawk,$(SQUAWK)),$(SQUAWK_DIR)/bin/squawk)
	$(GO) run ./internal/migrationlint/cmd/migrationlint -squawk $(SQUAWK) -squawk-version $(SQUAWK_VERSION) db/migrations

## vuln: known vulnerabilities (needs access to vuln.go.dev)
vuln: bin/govulncheck
	bin/govulncheck ./...

## bench: end-to-end throughput (BENCHMARKS.md): the provider latency sweep
## (0, 50, 200, 500, 1000 and 2000 ms) of billing, billing BENCH_BASELINE
## (3f706e0, built once from this repository's history into
## ~/.cache/billing/bench-binaries) and the seed design, PAYMENT_MAX_RPS=100,
## and pgbench (billing's and the seed's per-event SQL), on the embedded
## kfake broker and on a one-node Apache Kafka, against a PostgreSQL cluster
## of its own (initdb'd in a temporary directory), with each scenario's WAL
## and PostgreSQL CPU per event; redraws bench/throughput/sweep.svg
## (ARGS="-broker kfake|apache|both -nodes 1|3 -pgbench 0 -profile DIR
## -replicas 1,2,3 -provider inprocess|process|node -timeline DIR"; default
## both brokers where Java and Maven are installed); billing is make build's
## binary, -provider process runs make dev's fakepsp
BENCH_BASELINE ?= 3f706e0
bench: build dev
	$(GO) run ./bench/throughput -baseline $(BENCH_BASELINE) -svg bench/throughput/sweep.svg $(ARGS)

## bench-dedup: processed_event at 10M rows, v7 vs v4 keys, DROP PARTITION vs
## DELETE, in a throwaway database on the local PostgreSQL (see BENCHMARKS.md;
## 15–25 min; ARGS="-rows 200000" for a quick check in ~40 s)
bench-dedup:
	$(GO) run ./bench/dedup $(ARGS)

## walk: count docs/architecture.md's walk: the production files and
## packages one valid event runs statements of that an idle serve, as long,
## does not (two coverage runs of TestServe_Walk on the kfake broker, ~15 s)
WALK_DIR ?= $(or $(TMPDIR),/tmp)/billing-walk
walk:
	mkdir -p $(WALK_DIR)
	for mode in idle event; do \
		KAFKA_TEST_BROKER=kfake BILLING_WALK=$$mode $(WITHPG) $(GO) test -tags dev -count=1 -run '^TestServe_Walk$$' \
			-covermode=set -coverpkg=./cmd/billing,./internal/... -coverprofile=$(WALK_DIR)/$$mode.out ./cmd/billing || exit 1; \
	done
	$(GO) run ./internal/dev/walk $(WALK_DIR)/idle.out $(WALK_DIR)/event.out

clean:
	rm -rf bin
