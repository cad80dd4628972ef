#!/usr/bin/env bash
# Build a current Kubernetes ($K8S_VERSION, KUBE=1.36) from the Go module
# proxy into $CACHE/bin: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl. Reused when its stamp matches.
#
# `go install k8s.io/kubernetes/cmd/...@vX` is refused: the module's go.mod
# replaces its staging modules (k8s.io/api, client-go, ...) with
# ./staging/..., which a module zip does not carry. So a small module of our
# own requires k8s.io/kubernetes $K8S_VERSION and replaces each staging
# module, as that version's go.mod lists them, with the published
# k8s.io/<name> $STAGING_VERSION; `go mod tidy` resolves the rest. The
# module cache and the build cache stay under $CACHE (never in the repo).
set -euo pipefail
# shellcheck source=scripts/kube-lab/common.sh
. "$(dirname "$0")/common.sh"

# One build at a time; nothing to do when the cache holds it.
k8s_build_begin
COMPONENTS=("${K8S_COMPONENTS[@]}")
key=$(k8s_key)
command -v go >/dev/null || die "no Go (this profile needs Go >= 1.26 and the Go module proxy)"
want=$(go_wanted)
have=$(go env GOVERSION)
[[ $(printf '%s\n%s\n' "go$want" "$have" | sort -V | head -n1) == "go$want" ]] ||
  die "Kubernetes $K8S_VERSION needs Go $want, have $have"

export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-modcacherw CGO_ENABLED=0
W=$CACHE/wrap
mkdir -p "$W" "$BIN"
log "go mod download k8s.io/kubernetes@$K8S_VERSION"
mod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[[ -f $mod ]] || die "the Go module proxy gave no go.mod for k8s.io/kubernetes@$K8S_VERSION"
{
  printf 'module kubelab.local/build\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$want" "$K8S_VERSION"
  sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$mod"
  printf ')\n'
} >"$W/go.mod"
grep -q "k8s.io/client-go => k8s.io/client-go $STAGING_VERSION" "$W/go.mod" ||
  die "no staging replaces found in $mod"
cat >"$W/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
EOF
log "go mod tidy (the staging modules at $STAGING_VERSION)"
(cd "$W" && go mod tidy)

v=$K8S_VERSION
mm=${v#v}; major=${mm%%.*}; minor=${mm#*.}; minor=${minor%%.*}
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for c in "${COMPONENTS[@]}"; do
  t0=$SECONDS
  log "go build $c"
  (cd "$W" && go build -trimpath -ldflags "$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c")
  mv "$BIN/$c.tmp" "$BIN/$c"
  log "built $c in $((SECONDS - t0)) s"
done
"$BIN/kubectl" version --client 2>/dev/null | grep -q "$v" || die "kubectl does not report $v"
"$BIN/kubelet" --version 2>/dev/null | grep -q "$v" || die "kubelet does not report $v"
stamp_set "$BIN/.stamp-k8s" "$key"
log "kubernetes $K8S_VERSION built into $BIN"
