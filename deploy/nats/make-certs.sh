#!/bin/sh
# Make a CA and a certificate per NATS server for deploy/nats/cluster-*.conf:
#
#   deploy/nats/make-certs.sh OUT_DIR HOST...      e.g. /etc/llmgw/tls nats-1.example.internal ...
#
# Writes OUT_DIR/ca.pem (give it to every client: $LLMGW_NATS_CA), ca-key.pem
# (keep it offline: whoever holds it can make a server the fleet trusts), and
# for each host OUT_DIR/<first label>.pem and -key.pem, valid for that name,
# its first label, localhost and 127.0.0.1. The servers use one certificate
# for clients and for the routes between them (mutual TLS: `verify: true`).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR HOST..." >&2; exit 2; }
out=$1; shift
DAYS=${DAYS:-825}
mkdir -p "$out"
umask 077
if [ ! -f "$out/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$DAYS" \
    -subj "/CN=llmgw NATS CA" -keyout "$out/ca-key.pem" -out "$out/ca.pem" 2>/dev/null
fi
for host in "$@"; do
  short=${host%%.*}
  ext="$out/$short.ext"
  printf 'subjectAltName=DNS:%s,DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' "$host" "$short" > "$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
    -keyout "$out/$short-key.pem" -out "$out/$short.csr" 2>/dev/null
  openssl x509 -req -in "$out/$short.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" -CAcreateserial \
    -days "$DAYS" -extfile "$ext" -out "$out/$short.pem" 2>/dev/null
  rm -f "$out/$short.csr" "$ext"
done
chmod 644 "$out/ca.pem"
echo "CA: $out/ca.pem; servers: $*"
