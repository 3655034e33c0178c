# syntax=docker/dockerfile:1
# churn-throttler: a static musl binary on a minimal non-root image.
#
#   docker build -t churn-throttler:0.1.0 .
#
# The same binary is built outside Docker by tests/docker/check.sh
# (cargo build --release --locked --target x86_64-unknown-linux-musl).

# Matches rust-toolchain.toml (channel 1.95.0); rustup installs exactly that
# channel from the toolchain file if the image's differs.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${RUST_IMAGE} AS chef
# musl-tools: musl-gcc, which ring's C and assembly parts need for the musl target.
# Pinned to bookworm's version (the same one tests/docker/check.sh installs).
ARG MUSL_TOOLS_VERSION=1.2.3-1
RUN apt-get update \
 && apt-get install -y --no-install-recommends "musl-tools=${MUSL_TOOLS_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY rust-toolchain.toml ./
RUN rustup target add x86_64-unknown-linux-musl \
 && cargo install cargo-chef --locked --version 0.1.78

# The dependency graph only (Cargo.toml, Cargo.lock, target names): this layer's
# output changes only when dependencies do.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
ENV CARGO_TARGET_DIR=/src/target
COPY --from=planner /src/recipe.json recipe.json
# Dependency caching layer: every dependency compiled for the release musl
# target; reused as long as recipe.json is unchanged.
RUN cargo chef cook --release --locked --target x86_64-unknown-linux-musl --bin churn-throttler --recipe-path recipe.json
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
# src/serve.rs embeds a fixture (include_str!) for `serve --dev`.
COPY tests/fixtures ./tests/fixtures
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin churn-throttler \
 && cp target/x86_64-unknown-linux-musl/release/churn-throttler /churn-throttler \
 && /churn-throttler --version \
 && mkdir /plugin && ln -s /churn-throttler /plugin/kubectl-churn_throttler

# distroless static: no shell, no package manager, CA certificates and
# /etc/passwd with the nonroot user (65532) only.
FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="churn-throttler" \
      org.opencontainers.image.description="Kubernetes admission webhook that paces pod churn cluster-wide" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder --chown=0:0 --chmod=0555 /churn-throttler /churn-throttler
# The kubectl plugin name (`kubectl churn-throttler status`): a symlink to the binary, which
# behaves as churn-throttler under that name; copied out of the image onto a PATH, e.g.
#   docker create --name ct churn-throttler:0.1.0 && docker cp -L ct:/churn-throttler ~/bin/kubectl-churn_throttler
COPY --from=builder /plugin/ /usr/local/bin/
USER 65532:65532
# 8443: HTTPS admission (/validate, /mutate); 9090: HTTP /metrics, /healthz, /readyz.
EXPOSE 8443 9090
ENTRYPOINT ["/churn-throttler"]
CMD ["serve"]
