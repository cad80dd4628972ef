#!/usr/bin/env bash
# Build Kubernetes v1.20.2 from Debian's `kubernetes` source package with
# Debian's Go 1.19, offline, into $CACHE/bin. Reused when its stamp matches.
set -euo pipefail
# shellcheck source=scripts/kube-lab/common.sh
. "$(dirname "$0")/common.sh"

# One build at a time; nothing to do when the cache holds it.
k8s_build_begin
COMPONENTS=("${K8S_COMPONENTS[@]}")
key=$(k8s_key)

command -v go >/dev/null || die "no Go: apt-get install golang-go (Debian bookworm gives 1.19)"
go version | grep -q 'go1\.19' || die "need Go 1.19 (Debian bookworm golang-go), have: $(go version)"
[[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ]] ||
  die "need golang-github-modern-go-reflect2-dev (reflect2 v1.0.2)"

# --- the source, through a private apt configuration ------------------------
APT=$CACHE/apt
SRC=$CACHE/src
mkdir -p "$APT/sources.list.d" "$APT/lists/partial" "$APT/cache/archives/partial" "$SRC" "$BIN"
tree=$(find "$SRC" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
if [[ -z $tree || ! -f $SRC/.stamp-src ]] || ! stamp_ok "$SRC/.stamp-src" "$K8S_DEB_SRC_VERSION"; then
  rm -rf "${SRC:?}"/*
  : >"$APT/sources.list"
  n=0
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    sed 's/^Types:.*/Types: deb-src/' "$f" >"$APT/sources.list.d/src$n.sources"
    n=$((n + 1))
  done
  if [[ -f /etc/apt/sources.list ]]; then
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$APT/sources.list"
  fi
  aptopts=(-o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=$APT/sources.list.d"
    -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache")
  log "apt-get update (private deb-src configuration in $APT)"
  apt-get "${aptopts[@]}" update -qq
  log "apt-get source kubernetes=$K8S_DEB_SRC_VERSION"
  (cd "$SRC" && apt-get "${aptopts[@]}" source --download-only "kubernetes=$K8S_DEB_SRC_VERSION")
  orig=$(find "$SRC" -maxdepth 1 -name 'kubernetes_*.orig.tar.*' | head -n1)
  [[ -n $orig ]] || die "no orig tarball downloaded"
  mkdir -p "$SRC/kubernetes-$K8S_VERSION"
  tar -xf "$orig" -C "$SRC/kubernetes-$K8S_VERSION" --strip-components=1
  stamp_set "$SRC/.stamp-src" "$K8S_DEB_SRC_VERSION"
fi
tree=$SRC/kubernetes-$K8S_VERSION
[[ -d $tree/vendor ]] || die "$tree has no vendor/"

# --- GOPATH mode --------------------------------------------------------------
GP=$CACHE/gopath
mkdir -p "$GP/src/k8s.io" "$CACHE/gocache"
ln -sfn "$tree" "$GP/src/k8s.io/kubernetes"
export GOPATH=$GP GO111MODULE=off GOPROXY=off GOFLAGS='' CGO_ENABLED=0 GOCACHE=$CACHE/gocache
cd "$GP/src/k8s.io/kubernetes"

# Fix 1: vendored reflect2 v1.0.1 crashes at run time with Go >= 1.18.
r2=vendor/github.com/modern-go/reflect2
if ! grep -qs 'reflect2 v1.0.2 from Debian' "$r2/.edgelink-kube"; then
  log "replacing vendored reflect2 with Debian's v1.0.2"
  rm -rf "$r2"
  mkdir -p "$r2"
  cp -rL /usr/share/gocode/src/github.com/modern-go/reflect2/. "$r2/"
  rm -f "$r2/go.mod" "$r2/go.sum"
  echo 'reflect2 v1.0.2 from Debian' >"$r2/.edgelink-kube"
fi

# Fix 2: generate pkg/generated/openapi/zz_generated.openapi.go.
oa=pkg/generated/openapi/zz_generated.openapi.go
if [[ ! -s $oa ]]; then
  log "building openapi-gen and generating $oa"
  go build -o "$CACHE/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  # The inputs of build/root/Makefile.generated_files: every package with a
  # `+k8s:openapi-gen=` tag.
  mapfile -t dirs < <(grep -rl --include='*.go' -E '^// *\+k8s:openapi-gen=' \
    pkg staging/src/k8s.io vendor/k8s.io 2>/dev/null |
    xargs -n1 dirname | sort -u |
    sed -e 's#^staging/src/##' -e 's#^vendor/##' -e 's#^pkg/#k8s.io/kubernetes/pkg/#' | sort -u)
  ((${#dirs[@]} > 0)) || die "no openapi-gen input packages found"
  inputs=$(IFS=,; echo "${dirs[*]}")
  "$CACHE/openapi-gen" --logtostderr \
    --input-dirs "$inputs" \
    --output-base "$GP/src" \
    --output-package k8s.io/kubernetes/pkg/generated/openapi \
    --go-header-file hack/boilerplate/boilerplate.generatego.txt \
    -O zz_generated.openapi \
    --report-filename "$CACHE/openapi-violations.txt" >"$CACHE/openapi-gen.log" 2>&1 ||
    { tail -20 "$CACHE/openapi-gen.log" >&2; die "openapi-gen failed"; }
  [[ -s $oa ]] || die "openapi-gen wrote no $oa"
fi

# --- build ----------------------------------------------------------------------
v=$K8S_VERSION
mm=${v#v}; major=${mm%%.*}; minor=${mm#*.}; minor=${minor%%.*}
ld="-s -w"
for p in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for c in "${COMPONENTS[@]}"; do
  t0=$SECONDS
  log "go build $c"
  go build -ldflags "$ld" -o "$BIN/$c.tmp" "./cmd/$c"
  mv "$BIN/$c.tmp" "$BIN/$c"
  log "built $c in $((SECONDS - t0)) s"
done
"$BIN/kubectl" version --client --short 2>/dev/null | grep -q "$v" || die "kubectl does not report $v"
stamp_set "$BIN/.stamp-k8s" "$key"
log "kubernetes $K8S_VERSION built into $BIN"
