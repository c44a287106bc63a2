#!/usr/bin/env bash
# Builds go-ycsb (github.com/pingcap/go-ycsb) with only its Redis binding, for
# benchmarks/go-ycsb.sh. The upstream `go install .../cmd/go-ycsb` links every database driver
# (TiKV, cgo SQLite, RocksDB, AWS, ...), a long build that needs a C toolchain; the Redis binding
# needs none of them. So this takes the release's source from the Go module proxy, drops the other
# drivers' imports from cmd/go-ycsb/main.go, and builds that with the release's own go.mod and
# go.sum (the same dependency versions as upstream). Needs `go` (1.18 or later) and the proxy.
#
#   benchmarks/go-ycsb-build.sh
#
# YCSB_VERSION (default v1.0.3) picks the release; YCSB_DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/go-ycsb) is where it goes: the binary in $YCSB_DIR/bin/go-ycsb, the
# source (with the workload files, $YCSB_DIR/src/workloads) in $YCSB_DIR/src. Builds at nice 19.
set -euo pipefail
version=${YCSB_VERSION:-v1.0.3}
dir=${YCSB_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/go-ycsb}
module=github.com/pingcap/go-ycsb

mkdir -p "$dir"
cd "$dir"
src=$(GOFLAGS=-mod=mod go mod download -json "$module@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -d "$src/cmd/go-ycsb" ] || { echo "go mod download gave no source for $module@$version" >&2; exit 1; }
rm -rf src
cp -r "$src" src
chmod -R u+w src
# Keep the Redis driver's import, drop the other drivers' imports and their comments.
sed -i -E '/^\t\/\/ Register /{/Register workload/!d}; /^\t_ "github.com\/pingcap\/go-ycsb\/db\/[a-z0-9]+"$/{/\/db\/redis"/!d}' \
  src/cmd/go-ycsb/main.go
drivers=$(grep -c '"github.com/pingcap/go-ycsb/db/' src/cmd/go-ycsb/main.go || true)
grep -q '_ "github.com/pingcap/go-ycsb/db/redis"' src/cmd/go-ycsb/main.go && [ "$drivers" = 1 ] ||
  { echo "cmd/go-ycsb/main.go of $version has another shape: expected one driver import (redis) after the edit, found $drivers" >&2; exit 1; }
mkdir -p bin
(cd src && GOFLAGS=-mod=mod nice -n 19 go build -o ../bin/go-ycsb ./cmd/go-ycsb)
echo "$version" > bin/VERSION
echo "built $dir/bin/go-ycsb ($module $version, Redis binding only)" >&2
