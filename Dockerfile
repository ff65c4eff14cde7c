# syntax=docker/dockerfile:1
#
# billing's container image: a static binary on distroless, non-root, no
# shell. deploy/check (make test) keeps the build command equal to the
# Makefile's `build` target.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t billing .

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/billing ./cmd/billing

# CA certificates (for TLS to Kafka, PostgreSQL and the provider) and
# tzdata are included; user nonroot is 65532:65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/billing /billing
USER 65532:65532
# serve's HTTP_ADDR (probes, /metrics; internal) and WEBHOOK_ADDR (the
# provider's webhooks): their defaults.
EXPOSE 8080 8090
ENTRYPOINT ["/billing"]
CMD ["serve"]
