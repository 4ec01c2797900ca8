#!/usr/bin/env bash
# Runs the Cloud Hypervisor driver's end-to-end suite (host/drivers/cloud-hypervisor/
# driver.e2e.test.ts) against a REAL cloud-hypervisor binary on a KVM host, instead of the
# simulator it uses everywhere else.
#
# NOT runnable on the development/CI machine this was written on: it has no /dev/kvm and no
# cloud-hypervisor binary can be installed there (CH is not packaged in Debian; fetch the pinned
# static release, e.g. cloud-hypervisor-static v53.0 from the project's GitHub releases, and
# check its checksum). Requirements on the KVM host:
#   - root (network namespaces, TAP devices), /dev/kvm, nftables, iproute2, debootstrap, e2fsprogs
#   - optional: `options kvm_intel nested=1` (or kvm_amd) for nestedVirt
#   - NESTBOX_CH_BIN=/path/to/cloud-hypervisor (v53.0)
#   - NESTBOX_TEST_CH_IMAGES (default /var/lib/nestbox/images): where `nestbox image build --vm`
#     puts vm-default/{vmlinuz,initrd.img,rootfs.img}; built here if missing (minutes).
# Usage: sudo NESTBOX_CH_BIN=/usr/local/bin/cloud-hypervisor scripts/kvm-smoke.sh
set -euo pipefail

: "${NESTBOX_CH_BIN:?set NESTBOX_CH_BIN to the cloud-hypervisor binary (v53.0)}"
if [ "$(id -u)" != 0 ]; then echo "kvm-smoke: needs root (network namespaces, TAP devices)" >&2; exit 2; fi
if [ ! -c /dev/kvm ]; then echo "kvm-smoke: /dev/kvm is missing; this script only runs on a KVM host" >&2; exit 2; fi
version=$("$NESTBOX_CH_BIN" --version)
case "$version" in
  *v53.*) ;;
  *) echo "kvm-smoke: warning: $version is not the pinned v53 release; the API description may differ" >&2 ;;
esac

cd "$(dirname "$0")/.."
images="${NESTBOX_TEST_CH_IMAGES:-/var/lib/nestbox/images}"
npm run build
started=$(date +%s)
NESTBOX_IMAGES_DIR="$images" node dist/src/cli.js image build --vm
echo "kvm-smoke: VM image ready in $(( $(date +%s) - started )) s"

export NESTBOX_DRIVER=cloud-hypervisor NESTBOX_CH_BIN NESTBOX_TEST_CH_IMAGES="$images"
exec npx vitest run host/drivers/cloud-hypervisor/driver.e2e.test.ts
