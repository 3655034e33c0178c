#!/usr/bin/env bash
# Makes a CA and a serving certificate for churn-throttler's webhook Service with
# openssl, and with --apply installs them: the TLS Secret the Deployment mounts,
# and the CA as caBundle of both webhook configurations.
#
# The alternative is cert-manager: manifests/overlays/cert-manager.
set -euo pipefail

prog="$(basename "$0")"

usage() {
  cat <<EOF
Usage: $prog [options]

Makes a CA and a serving certificate for the webhook Service, writes them to
--out-dir, and with --apply installs them into the cluster.

Files written (keys mode 0600):
  ca.crt ca.key      the CA (reused if both exist in --out-dir, unless --new-ca)
  tls.crt tls.key    the serving certificate and key, signed by the CA
  ca-bundle.b64      base64 of ca.crt on one line, the webhooks' caBundle

The serving certificate always covers:
  SERVICE.NAMESPACE.svc  and  SERVICE.NAMESPACE.svc.cluster.local

Options:
  -o, --out-dir DIR      where to write (default: ./churn-throttler-certs)
  -n, --namespace NS     namespace of the Service (default: churn-throttler)
  -s, --service NAME     name of the Service (default: churn-throttler)
      --dns NAME         extra DNS name in the certificate (repeatable)
      --ip ADDRESS       extra IP address in the certificate (repeatable), e.g. 127.0.0.1
      --days N           validity of the serving certificate in days (default: 365)
      --ca-days N        validity of a new CA in days (default: 3650)
      --key-type TYPE    ecdsa (P-256, default) or rsa (2048 bits)
      --new-ca           make a new CA even if --out-dir holds one
      --apply            create or update the Secret and patch caBundle into both
                         webhook configurations with kubectl
      --secret NAME      TLS Secret to create/update (default: churn-throttler-tls)
      --webhook NAME     name of the Validating and Mutating webhook configurations
                         (default: churn-throttler)
      --kubectl PATH     kubectl to use with --apply (default: kubectl on PATH)
      --context NAME     kubeconfig context for --apply
  -h, --help             this text

Examples:
  $prog -o /tmp/ct-certs                       # files only
  $prog -o /tmp/ct-certs --apply               # and install them
  $prog -o /tmp/ct-certs --ip 127.0.0.1 --dns localhost   # also for a local process

Rotation: run again with the same --out-dir (and --apply): a new serving
certificate and key are made every time. The CA is reused, so
caBundle does not change and the running server picks up the new Secret content
by itself (it polls the mounted files). With --new-ca, the webhooks trust only
the new CA from the moment caBundle is patched; pods still serving the old
certificate fail TLS until they reload it (a few seconds; failurePolicy Ignore
lets requests through unpaced meanwhile).

Exit status: 0 on success, 2 on a usage error, 1 on any other error.
EOF
}

die() { echo "$prog: error: $*" >&2; exit 1; }
usage_error() { echo "$prog: $*" >&2; echo "Try '$prog --help'." >&2; exit 2; }
log() { echo "$prog: $*" >&2; }

out_dir="./churn-throttler-certs"
namespace="churn-throttler"
service="churn-throttler"
extra_dns=()
extra_ip=()
days=365
ca_days=3650
key_type="ecdsa"
new_ca=0
apply=0
secret="churn-throttler-tls"
webhook="churn-throttler"
kubectl="kubectl"
context=""

need_arg() { [[ $# -ge 2 && -n "$2" ]] || usage_error "option $1 needs a value"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    -o|--out-dir) need_arg "$@"; out_dir="$2"; shift 2 ;;
    -n|--namespace) need_arg "$@"; namespace="$2"; shift 2 ;;
    -s|--service) need_arg "$@"; service="$2"; shift 2 ;;
    --dns) need_arg "$@"; extra_dns+=("$2"); shift 2 ;;
    --ip) need_arg "$@"; extra_ip+=("$2"); shift 2 ;;
    --days) need_arg "$@"; days="$2"; shift 2 ;;
    --ca-days) need_arg "$@"; ca_days="$2"; shift 2 ;;
    --key-type) need_arg "$@"; key_type="$2"; shift 2 ;;
    --new-ca) new_ca=1; shift ;;
    --apply) apply=1; shift ;;
    --secret) need_arg "$@"; secret="$2"; shift 2 ;;
    --webhook) need_arg "$@"; webhook="$2"; shift 2 ;;
    --kubectl) need_arg "$@"; kubectl="$2"; shift 2 ;;
    --context) need_arg "$@"; context="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    *) usage_error "unknown argument: $1" ;;
  esac
done

# --- validate the inputs -------------------------------------------------------
dns_re='^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'
label_re='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'
[[ "$namespace" =~ $label_re && ${#namespace} -le 63 ]] || usage_error "--namespace '$namespace' is not a valid namespace name"
[[ "$service" =~ $label_re && ${#service} -le 63 ]] || usage_error "--service '$service' is not a valid Service name"
for d in "${extra_dns[@]}"; do
  [[ "$d" =~ $dns_re || ( "${d:0:2}" == "*." && "${d:2}" =~ $dns_re ) ]] \
    || usage_error "--dns '$d' is not a DNS name (lower case letters, digits, '-' and '.')"
done
for ip in "${extra_ip[@]}"; do
  python3 -c 'import ipaddress,sys; ipaddress.ip_address(sys.argv[1])' "$ip" 2>/dev/null \
    || usage_error "--ip '$ip' is not an IPv4 or IPv6 address"
done
[[ "$days" =~ ^[1-9][0-9]*$ ]] || usage_error "--days must be a positive whole number, got '$days'"
[[ "$ca_days" =~ ^[1-9][0-9]*$ ]] || usage_error "--ca-days must be a positive whole number, got '$ca_days'"
case "$key_type" in ecdsa|rsa) ;; *) usage_error "--key-type must be ecdsa or rsa, got '$key_type'" ;; esac

command -v openssl >/dev/null || die "openssl is not on PATH (Debian: apt-get install openssl)"
if [[ $apply == 1 ]]; then
  command -v "$kubectl" >/dev/null || die "--apply needs kubectl, and '$kubectl' was not found (use --kubectl PATH)"
fi

mkdir -p "$out_dir" || die "cannot create --out-dir '$out_dir'"
[[ -w "$out_dir" ]] || die "--out-dir '$out_dir' is not writable"
umask 077

# --- key and certificate making -----------------------------------------------
genkey() { # genkey FILE
  case "$key_type" in
    ecdsa) openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null ;;
    rsa) openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null ;;
  esac || die "openssl could not make a $key_type key in $1"
  chmod 600 "$1"
}

tmp="$(mktemp -d "$out_dir/.gen-certs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

if [[ $new_ca == 0 && -s "$out_dir/ca.crt" && -s "$out_dir/ca.key" ]]; then
  openssl x509 -in "$out_dir/ca.crt" -noout -checkend 86400 >/dev/null \
    || die "the CA in $out_dir/ca.crt expires within a day; use --new-ca"
  # The CA's key must be the one in ca.key, or every signature below is worthless.
  [[ "$(openssl x509 -in "$out_dir/ca.crt" -noout -pubkey)" == "$(openssl pkey -in "$out_dir/ca.key" -pubout 2>/dev/null)" ]] \
    || die "$out_dir/ca.key does not belong to $out_dir/ca.crt; use --new-ca"
  log "reusing the CA in $out_dir/ca.crt (--new-ca makes a new one)"
  cp "$out_dir/ca.crt" "$tmp/ca.crt"
  cp "$out_dir/ca.key" "$tmp/ca.key"
else
  log "making a new CA ($key_type, $ca_days days)"
  genkey "$tmp/ca.key"
  cat >"$tmp/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = churn-throttler-ca
O = churn-throttler
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
  openssl req -x509 -new -key "$tmp/ca.key" -days "$ca_days" -sha256 \
    -config "$tmp/ca.cnf" -out "$tmp/ca.crt" 2>"$tmp/err" \
    || { cat "$tmp/err" >&2; die "openssl could not make the CA certificate"; }
fi

sans=("DNS:$service.$namespace.svc" "DNS:$service.$namespace.svc.cluster.local")
for d in "${extra_dns[@]}"; do sans+=("DNS:$d"); done
for ip in "${extra_ip[@]}"; do sans+=("IP:$ip"); done
san_line="$(IFS=,; echo "${sans[*]}")"

genkey "$tmp/tls.key"
cat >"$tmp/tls.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = $service.$namespace.svc
O = churn-throttler
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san_line
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
openssl req -new -key "$tmp/tls.key" -config "$tmp/tls.cnf" -out "$tmp/tls.csr" 2>"$tmp/err" \
  || { cat "$tmp/err" >&2; die "openssl could not make the certificate request"; }
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days "$days" -sha256 -extfile "$tmp/tls.cnf" -extensions v3_server -out "$tmp/tls.crt" 2>"$tmp/err" \
  || { cat "$tmp/err" >&2; die "openssl could not sign the serving certificate"; }
openssl verify -CAfile "$tmp/ca.crt" -purpose sslserver "$tmp/tls.crt" >/dev/null 2>"$tmp/err" \
  || { cat "$tmp/err" >&2; die "the new serving certificate does not verify against the CA"; }
base64 <"$tmp/ca.crt" | tr -d '\n' >"$tmp/ca-bundle.b64"

# Move into place only when everything was made.
for f in ca.crt ca.key tls.crt tls.key ca-bundle.b64; do
  mv -f "$tmp/$f" "$out_dir/$f"
done
chmod 600 "$out_dir/ca.key" "$out_dir/tls.key"
chmod 644 "$out_dir/ca.crt" "$out_dir/tls.crt" "$out_dir/ca-bundle.b64"
log "wrote $out_dir/{ca.crt,ca.key,tls.crt,tls.key,ca-bundle.b64}"
log "serving certificate SANs: $san_line; expires $(openssl x509 -in "$out_dir/tls.crt" -noout -enddate | cut -d= -f2)"

[[ $apply == 1 ]] || exit 0

# --- install ------------------------------------------------------------------
k=("$kubectl")
[[ -n "$context" ]] && k+=(--context "$context")

"${k[@]}" get namespace "$namespace" >/dev/null 2>"$tmp/err" \
  || { cat "$tmp/err" >&2; die "namespace '$namespace' not found: apply the manifests first (kubectl apply --server-side -k manifests/base)"; }

log "creating or updating Secret $namespace/$secret"
"${k[@]}" -n "$namespace" create secret tls "$secret" --cert="$out_dir/tls.crt" --key="$out_dir/tls.key" \
    --dry-run=client -o yaml \
  | "${k[@]}" apply --server-side --force-conflicts --field-manager=churn-throttler-gen-certs -f - >&2 \
  || die "could not create or update Secret $namespace/$secret"

bundle="$(cat "$out_dir/ca-bundle.b64")"
for kind in validatingwebhookconfiguration mutatingwebhookconfiguration; do
  count="$("${k[@]}" get "$kind" "$webhook" -o go-template='{{len .webhooks}}' 2>"$tmp/err")" \
    || { cat "$tmp/err" >&2; die "$kind/$webhook not found: apply the manifests first"; }
  [[ "$count" =~ ^[0-9]+$ && "$count" -gt 0 ]] || die "$kind/$webhook has no webhooks"
  patch="["
  for ((i = 0; i < count; i++)); do
    [[ $i -gt 0 ]] && patch+=","
    patch+="{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$bundle\"}"
  done
  patch+="]"
  "${k[@]}" patch "$kind" "$webhook" --type=json -p "$patch" >&2 \
    || die "could not patch caBundle into $kind/$webhook"
  log "patched caBundle into $kind/$webhook ($count webhook(s))"
done
log "done: the server reloads the certificate from the Secret by itself"
