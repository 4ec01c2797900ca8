#!/usr/bin/env bash
# System packages Nestbox needs on Debian/Ubuntu, as root. With --with-postgres (the test
# command's form), also what only the tests need: a local PostgreSQL with a `nestbox` role, and
# the image tests' registry and image ingredients.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [[ $(id -u) -ne 0 ]]; then echo "run as root: sandboxes need namespaces, cgroups and nftables" >&2; exit 1; fi
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if ((node_major < 20)); then
  echo "Nestbox needs Node.js 20 or newer with npm (found: $(node --version 2>/dev/null || echo none))." >&2
  echo "Install it from your distribution or https://nodejs.org, then run this again." >&2
  exit 1
fi

# gcc + libc6-dev build the static helpers (host/guest-agent/pty-helper/); libseccomp-dev gives
# nestbox-seccomp the static libseccomp it links (the sandbox's seccomp profile).
# xfsprogs formats the loop-mounted reflink store; e2fsprogs (mkfs.ext4) formats each sandbox's disk.
# skopeo pulls OCI/Docker images from registries and umoci unpacks them into root filesystems
# (host/images/oci/); ADD of a bzip2, xz or zstd tarball is decompressed with bzip2, xz and zstd.
# lxcfs gives each sandbox its own /proc/meminfo, cpuinfo, stat, uptime… (host/drivers/local/lxcfs.ts).
# qemu-system-common ships Debian 12's virtiofsd (/usr/lib/qemu/virtiofsd), which shares volumes
# with microVMs over virtio-fs (host/drivers/cloud-hypervisor/virtiofs.ts); from Debian 13 on the
# standalone, maintained `virtiofsd` package is installed instead when the archive has it.
packages=(debootstrap nftables tini iproute2 util-linux e2fsprogs procps psmisc ca-certificates gcc libc6-dev libseccomp-dev xfsprogs conntrack tar perl-base skopeo umoci bzip2 xz-utils zstd lxcfs)
if apt-cache show virtiofsd >/dev/null 2>&1; then packages+=(virtiofsd); else packages+=(qemu-system-common); fi
with_postgres=false
# Tests only: the image tests run Debian's Distribution registry (docker-registry) on loopback,
# build their images from busybox-static's binary and protect one registry with an htpasswd
# file (apache2-utils). The Python contract tests' virtualenv is built from Debian's python3 with
# python3-venv (scripts/install-python-sdks.sh, at the end).
# The Cloud Hypervisor simulator's image guests resolve socat's libraries (tests only).
# The guest agent's code-interpreter tests run its kernel bridge on the host's own python3
# against Debian's IPython kernel, jupyter_client, matplotlib and pandas (tests only).
# The dashboard's tests drive Debian's Chromium with playwright-core (no browser download); the
# CLI's `shell` test runs it on a terminal under tmux (tests only). The SSH gateway's tests run
# OpenSSH's client (ssh, scp, sftp, ssh-keygen: openssh-client; tests only). The deployment guide's units are
# checked by `systemd-analyze verify`, from systemd (tests only).
[[ "${1:-}" == "--with-postgres" ]] && with_postgres=true && packages+=(postgresql docker-registry busybox-static apache2-utils python3 python3-venv socat python3-ipykernel python3-jupyter-client python3-matplotlib python3-pandas chromium tmux systemd openssh-client)

missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's package enables a registry on port 5000 under systemd; the tests start their own.
if $with_postgres && [[ -d /run/systemd/system ]] && systemctl is-enabled -q docker-registry.service 2>/dev/null; then
  systemctl disable --now -q docker-registry.service || true
fi

if $with_postgres; then
  cluster=$(pg_lsclusters --no-header | awk 'NR==1 {print $1" "$2}')
  if [[ -z "$cluster" ]]; then pg_createcluster 15 main >/dev/null; cluster="15 main"; fi
  pg_ctlcluster $cluster start 2>/dev/null || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 && break; sleep 0.5; done
  su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='nestbox'\"" | grep -q 1 ||
    su postgres -c "psql -qc \"CREATE ROLE nestbox LOGIN SUPERUSER PASSWORD 'nestbox'\""
fi

# The real Python SDKs (PyPI, pinned) the Python contract tests drive, in a cached virtualenv.
if $with_postgres; then
  "$(dirname "$0")/install-python-sdks.sh" >/dev/null
fi
