# syntax=docker/dockerfile:1
#
# billing's container image: a static binary on distroless, non-root, no
# shell. The image that ships is the last stage, built by default; the
# stage dev is the developer build (the developer commands too: a fake
# broker, a fake provider), for docker-compose's fake provider and
# producer only. deploy/check (make test) keeps their build commands equal
# to the Makefile's `build` and `dev` targets.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t billing .
#   docker build --target dev -t billing:dev .

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS source
WORKDIR /src
# Modules first: a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .

FROM source AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/billing ./cmd/billing

# The developer build, for the target dev only: BuildKit builds no stage
# the target does not need, so the image that ships never compiles it.
FROM source AS dev-build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH \
    CGO_ENABLED=0 go build -tags dev -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/billing ./cmd/billing

FROM gcr.io/distroless/static-debian12:nonroot AS dev
COPY --from=dev-build /out/billing /billing
USER 65532:65532
ENTRYPOINT ["/billing"]

# The image that ships: CA certificates (for TLS to Kafka, PostgreSQL and
# the provider) and tzdata are included; user nonroot is 65532:65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/billing /billing
USER 65532:65532
# serve's HTTP_ADDR (probes, /metrics; internal) and WEBHOOK_ADDR (the
# provider's webhooks): their defaults.
EXPOSE 8080 8090
ENTRYPOINT ["/billing"]
CMD ["serve"]
