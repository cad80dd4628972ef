#!/usr/bin/env bash
# make lint-vagrant (CI): what can be checked of the Vagrant lab without a
# hypervisor.
#
#   - `vagrant validate --ignore-provider` on vagrant/Vagrantfile, twice: as
#     in a fresh checkout, and with an (empty) edgelink image saved, which
#     adds kedge1's image provisioners. Vagrant's state and its home go to a
#     temporary directory: nothing is written into the checkout or ~.
#   - shellcheck -x on every shell script of the checkout (by extension .sh
#     or a sh/bash shebang; not target/ or Vagrant's state).
#
# Needs vagrant and shellcheck (scripts/install-deps.sh test). Works offline.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in vagrant shellcheck; do
    command -v "$tool" >/dev/null ||
        { echo "check-vagrant: $tool is not installed (scripts/install-deps.sh test)" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export VAGRANT_HOME=$tmp/home VAGRANT_DOTFILE_PATH=$tmp/dotfile
export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_NO_COLOR=1 EDGELINK_IMAGE_DIR=$tmp/build

validate() {
    local start=$SECONDS
    (cd vagrant && vagrant validate --ignore-provider) >"$tmp/out" 2>&1 || {
        cat "$tmp/out" >&2
        echo "check-vagrant: vagrant validate failed ($1)" >&2
        exit 1
    }
    echo "check-vagrant: vagrant validate --ignore-provider: ok, $1 ($((SECONDS - start)) s)"
}
validate "no edgelink image"
mkdir -p "$EDGELINK_IMAGE_DIR"
: > "$EDGELINK_IMAGE_DIR/edgelink-image.tar"
echo docker.io/library/edgelink:0.0.0 > "$EDGELINK_IMAGE_DIR/edgelink-image.ref"
validate "with an edgelink image"

scripts=()
while IFS= read -r -d '' f; do
    first=''
    IFS= read -r first < "$f" || true
    if [[ $f == *.sh || $first =~ ^#!.*[/\ ](ba)?sh([[:space:]]|$) ]]; then
        scripts+=("${f#./}")
    fi
done < <(find . \( -path ./.git -o -path ./target -o -path ./.lab \
    -o -name .vagrant -o -name .build \) -prune -o -type f -print0 | sort -z)
shellcheck -x "${scripts[@]}"
echo "check-vagrant: shellcheck: ${#scripts[@]} scripts clean"
