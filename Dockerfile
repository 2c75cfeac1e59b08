# The operator's image for people who build with Docker. `make image` builds the same image with
# no container engine (tools/oci-image): the same two static binaries on an empty base, the same
# numeric non-root user, the operator as entrypoint. A test keeps the two in step.
#
#   docker build -t automanager-operator:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Static binaries (glibc's static libc, from the image's libc6-dev): no libc or loader needed.
RUN RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked \
      --target x86_64-unknown-linux-gnu -p automanager-operator -p manager-sim --bins

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/automanager-operator /automanager-operator
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/manager-sim /manager-sim
USER 65532:65532
ENTRYPOINT ["/automanager-operator"]
