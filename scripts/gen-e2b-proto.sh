#!/bin/sh
# Regenerates compat/e2b/gen/ from compat/e2b/proto/ (the generated files are committed, so a
# build never needs this). Uses the locally installed buf and protoc-gen-es.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/compat/e2b/proto"
rm -rf ../gen
PATH="$root/node_modules/.bin:$PATH" buf generate
