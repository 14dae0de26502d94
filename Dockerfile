# CAPTF's images for those who build with Docker (BuildKit):
#   docker build --target runner -t captf-runner .
#   docker build -t captf-manager .
# `make images` (hack/images.sh) builds the same images without a daemon;
# tests/images.rs holds this file to the same files, user and entrypoints.
# The binaries are linked statically, so the images hold nothing else.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
      cargo build --release --target x86_64-unknown-linux-gnu --bin captf-manager --bin captf-runner \
 && cd target/x86_64-unknown-linux-gnu/release \
 && strip --strip-debug captf-manager captf-runner

# What both images share: their labels and their user.
FROM scratch AS base
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/captf-io/captf
LABEL org.opencontainers.image.source=$SOURCE \
      org.opencontainers.image.revision=$REVISION \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.licenses=Apache-2.0
USER 65532:65532

FROM base AS runner
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/captf-runner /runner
ENTRYPOINT ["/runner"]

FROM base AS manager
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/captf-manager /manager
# The manager's default runner image is its own.
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/captf-runner /runner
ENTRYPOINT ["/manager"]
