# Multi-stage: build with the Rust toolchain, run on a slim Debian with only
# the binary (migrations and Lua scripts are compiled into it).
FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY lua ./lua
COPY migrations ./migrations
# The benchmarks' crate is a workspace member: cargo reads its manifest, but
# only the service's binary is built.
COPY bench ./bench
RUN cargo build --release --locked --bin flashsale \
    && strip target/release/flashsale

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/flashsale /usr/local/bin/flashsale
USER nobody
EXPOSE 8080
ENTRYPOINT ["flashsale"]
CMD ["serve"]
