# syntax=docker/dockerfile:1
# The single `mailcluster` image: mail pods (`serve`), the operator (`operator`), the
# schema migration and stress Jobs (`migrate`, `stress`) all run this binary.
#
#   docker build -t ghcr.io/mailcluster/mailcluster:0.1.0 .
#
# TLS is rustls with the ring provider everywhere (server, PostgreSQL, Redis, the
# Kubernetes client) and SQLite is compiled in, so the binary links only glibc and
# libgcc: the runtime stage is distroless "cc" (glibc, libgcc, CA certificates, no
# shell, no package manager) and runs as its built-in non-root user 65532, the UID
# the operator's pod security contexts expect.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-trixie AS build
WORKDIR /src
# ring and the bundled SQLite are C code built by the cc crate: gcc and libc6-dev come
# with the slim Rust image; nothing else (no OpenSSL headers) is needed.
COPY . .
# Cache mounts keep the crate registry and build artefacts between builds; the binary
# is copied out of the cache mount inside the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p mailcluster \
    && install -D -m 0755 target/release/mailcluster /out/mailcluster \
    && mkdir -p /out/data

FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=build /out/mailcluster /usr/local/bin/mailcluster
# The embedded store and generated certificate of `docker run ... serve`; in
# Kubernetes the operator mounts an emptyDir here and keeps the root read-only.
COPY --from=build --chown=65532:65532 /out/data /var/lib/mailcluster
ENV MAILCLUSTER_DATA_DIR=/var/lib/mailcluster
USER 65532:65532
# Mail listeners (standard port + 10000), the admin port, the operator's metrics,
# the delivering pods' group commit across pods.
EXPOSE 10025 10587 10465 10143 10993 14190 10110 10995 9090 8080 7025
ENTRYPOINT ["/usr/local/bin/mailcluster"]
CMD ["serve"]
