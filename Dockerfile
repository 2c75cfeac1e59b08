# The operator's image for people who build with Docker. `make image` builds the same image with
# no container engine (tools/oci-image): the same two static binaries and their SBOMs on an empty
# base, the same numeric non-root user, the operator as entrypoint, the same labels. A test
# computes this file's image config with BuildKit's own converter and compares the two.
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t automanager-operator:0.1.0 .

FROM rust:1.95-bookworm AS build
# The SBOM generator, from crates.io, at the version tools/sbom.sh pins.
RUN cargo install --locked --version 0.5.9 cargo-cyclonedx
WORKDIR /src
COPY . .
# Static binaries (glibc's static libc, from the image's libc6-dev): no libc or loader needed.
RUN RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked \
      --target x86_64-unknown-linux-gnu -p automanager-operator -p manager-sim --bins
RUN tools/sbom.sh /sbom

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/automanager-operator /automanager-operator
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/manager-sim /manager-sim
COPY --from=build /sbom/automanager-operator.cdx.json /sbom/automanager-operator.cdx.json
COPY --from=build /sbom/manager-sim.cdx.json /sbom/manager-sim.cdx.json
LABEL org.opencontainers.image.title="automanager-operator" \
      org.opencontainers.image.description="The AutoManager Kubernetes operator (and manager-sim)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/norskvideo/automanager" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/automanager-operator"]
