#!/usr/bin/env bash
# Builds the incontext Wasm image from deploy/oci/Dockerfile into an OCI image layout directory,
# without a Docker daemon: buildah (Debian package `buildah`) with vfs storage in a throwaway
# directory. The build is reproducible (fixed timestamps, no builder label, file mode 0644): the
# same incontext.wasm always gives the same manifest digest.
#
# usage: deploy/oci/build-layout.sh [-f DOCKERFILE] [WASM [OUT_DIR [TAG]]]
#   WASM      default target/wasm32-wasip1/release/incontext.wasm
#   OUT_DIR   default target/oci/incontext (replaced)
#   TAG       default the crate version from Cargo.toml
#
# Prints the manifest digest (64 hex digits, no "sha256:") on stdout: the value for the
# WasmPlugin `sha256` and the EnvoyExtensionPolicy `image.sha256`, provided the image is pushed
# with a digest-preserving copy, e.g.
#   skopeo copy --preserve-digests oci:target/oci/incontext:0.1.0 docker://REGISTRY/incontext:0.1.0
# Needs root (or a working rootless buildah setup).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

dockerfile="$here/Dockerfile"
if [[ "${1:-}" == "-f" ]]; then
    [[ $# -ge 2 ]] || { echo "build-layout.sh: -f needs a Dockerfile" >&2; exit 2; }
    dockerfile="$2"
    shift 2
fi
wasm="${1:-$root/target/wasm32-wasip1/release/incontext.wasm}"
out="${2:-$root/target/oci/incontext}"
tag="${3:-$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)}"

command -v buildah >/dev/null || {
    echo "build-layout.sh: buildah not found (Debian: apt-get install buildah)" >&2
    exit 1
}
[[ -f "$wasm" ]] || {
    echo "build-layout.sh: $wasm not found (scripts/build-wasm.sh)" >&2
    exit 1
}
[[ -f "$dockerfile" ]] || { echo "build-layout.sh: $dockerfile not found" >&2; exit 1; }
[[ -n "$tag" ]] || { echo "build-layout.sh: no tag" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/context"
cp "$dockerfile" "$work/context/Dockerfile"
cp "$wasm" "$work/context/incontext.wasm"
chmod 0644 "$work/context/incontext.wasm"

bh=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
image="localhost/incontext:$tag"
"${bh[@]}" bud --quiet --format oci --timestamp 0 --identity-label=false \
    -f "$work/context/Dockerfile" -t "$image" "$work/context" >&2

rm -rf "$out"
mkdir -p "$(dirname "$out")"
# gzip: the "compat" layer media type the Istio / Envoy Gateway fetchers accept.
"${bh[@]}" push --quiet --compression-format gzip "$image" "oci:$out:$tag" >&2

digest="$(grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$out/index.json" | head -n1 | sed 's/.*sha256:\([0-9a-f]*\)"/\1/')"
[[ -n "$digest" ]] || { echo "build-layout.sh: no manifest digest in $out/index.json" >&2; exit 1; }
echo "build-layout.sh: $out (tag $tag), manifest sha256:$digest" >&2
echo "$digest"
