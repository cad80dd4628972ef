# shellcheck shell=bash
# The lab's certificates and kubeconfigs (sourced by up.sh and
# current/up.sh, after common.sh): a CA under $RUN/pki, `cert NAME CN [O]
# [SAN]` signed by it, `kubeconfig NAME SERVER` -> $RUN/kube/NAME.kubeconfig.

P=$RUN/pki
mkdir -p "$P" "$RUN/kube"
if [[ ! -f $P/ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kube-lab-ca" \
    -keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
fi
# cert NAME CN [O] [SAN]
cert() {
  local n=$1 cn=$2 o=${3:-} san=${4:-} subj
  [[ -f $P/$n.crt ]] && return 0
  subj="/CN=$cn"; [[ -n $o ]] && subj="/O=$o$subj"
  openssl req -new -newkey rsa:2048 -nodes -subj "$subj" -keyout "$P/$n.key" -out "$P/$n.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n $san ]]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$san"
    else echo "extendedKeyUsage=clientAuth"; fi
  } >"$P/$n.ext"
  openssl x509 -req -in "$P/$n.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 \
    -extfile "$P/$n.ext" -out "$P/$n.crt" 2>/dev/null
  rm -f "$P/$n.csr" "$P/$n.ext"
}
# kubeconfig NAME SERVER -> $RUN/kube/NAME.kubeconfig
kubeconfig() {
  local n=$1 server=$2 f=$RUN/kube/$1.kubeconfig
  cat >"$f" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kube-lab
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: $n
  user:
    client-certificate-data: $(base64 -w0 "$P/$n.crt")
    client-key-data: $(base64 -w0 "$P/$n.key")
contexts:
- name: kube-lab
  context: {cluster: kube-lab, user: $n}
current-context: kube-lab
KC
  chmod 600 "$f"
}
