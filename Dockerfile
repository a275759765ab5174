# Multi-stage: build with the Rust toolchain, run on a slim Debian with only
# the binary (migrations and Lua scripts are compiled into it).
#
#   docker build .                               the image users build (stage `runtime`)
#   docker build --target runtime-prebuilt \
#     --build-arg PREBUILT=target/release/flashsale .
#                                                the same runtime around a binary
#                                                built outside (CI's compose test:
#                                                no Rust image needed)
#
# RUNTIME_BASE names the runtime's Debian (the compose test gives a local
# debootstrap image: no registry there).
ARG RUNTIME_BASE=debian:bookworm-slim

FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The query macros' data (built offline: .cargo/config.toml).
COPY .cargo ./.cargo
COPY .sqlx ./.sqlx
COPY src ./src
COPY lua ./lua
COPY migrations ./migrations
# The benchmarks' crate is a workspace member: cargo reads its manifest, but
# only the service's binary is built.
COPY bench ./bench
# The commit `flashsale --version` names (no .git in the context):
# docker build --build-arg FLASHSALE_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG FLASHSALE_COMMIT=
RUN cargo build --release --locked --bin flashsale \
    && strip target/release/flashsale

# What every runtime has: CA certificates (events pushed to https://
# endpoints, a JWKS file over TLS), a user of its own, the health check.
FROM ${RUNTIME_BASE} AS runtime-base
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin flashsale
COPY deploy/healthcheck.sh /usr/local/bin/flashsale-healthcheck
# GET /healthz on the process's own port (serve: LISTEN_ADDR; worker:
# METRICS_ADDR, none set: nothing to ask), by bash's /dev/tcp: no curl.
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/flashsale-healthcheck"]
USER flashsale
EXPOSE 8080
ENTRYPOINT ["flashsale"]
CMD ["serve"]

# The runtime around a binary built outside the image (its path in the
# build context).
FROM runtime-base AS runtime-prebuilt
ARG PREBUILT=target/release/flashsale
COPY ${PREBUILT} /usr/local/bin/flashsale

# The default: the runtime around the binary built above.
FROM runtime-base AS runtime
COPY --from=build /src/target/release/flashsale /usr/local/bin/flashsale
